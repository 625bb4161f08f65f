"""Report samples: each worker report's figures per version, kept a short while so the
canary analysis can sum any window of them (the per-minute roll-ups are too coarse for a
window of seconds, and say nothing of outputs)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from registry.models import ModelVersion, ReportSample


def store(worker_id: str, resolved: list[tuple[ModelVersion, dict]], received_at: datetime | None = None) -> None:
    """One row per (version, figures) of one report."""
    at = received_at or timezone.now()
    ReportSample.objects.bulk_create([ReportSample(version=version, worker_id=worker_id, received_at=at, figures=figures) for version, figures in resolved])


def window(version: ModelVersion, start: datetime, end: datetime) -> list[dict]:
    """The figures every worker reported for ``version`` in [start, end)."""
    rows = ReportSample.objects.filter(version=version, received_at__gte=start, received_at__lt=end)
    return list(rows.values_list("figures", flat=True))


def prune(now: datetime | None = None) -> int:
    """Delete samples older than REPORT_SAMPLE_RETENTION_S; the number deleted."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.REPORT_SAMPLE_RETENTION_S)
    deleted, _ = ReportSample.objects.filter(received_at__lt=cutoff).delete()
    return deleted
