"""Worker reports: per-minute roll-ups per version, and the live relay to browsers."""

from __future__ import annotations

import logging
from datetime import datetime

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from registry.fleet import samples
from registry.models import ModelVersion, VersionMetricMinute, Worker

logger = logging.getLogger(__name__)
LIVE_GROUP = "live"


def ingest_report(worker: Worker, report: dict, received_at: datetime | None = None) -> None:
    """Roll the report's per-version figures up per minute, keep them as samples for the
    canary analysis and the charts, and relay them to browsers. The figures were validated
    with the report (``serving.contract``); versions this console does not know are skipped.
    ``received_at`` is now, unless a test replays a report at another moment."""
    at = received_at or timezone.now()
    resolved = _resolve_versions(report.get("versions") or [])
    for version, figures in resolved:
        add_to_rollup(version, figures, at)
    samples.store(worker.worker_id, resolved, at)
    relay(worker, report)


def _resolve_versions(entries: list[dict]) -> list[tuple[ModelVersion, dict]]:
    wanted = {(entry["model"], entry["version"]) for entry in entries}
    if not wanted:
        return []
    matches = Q()
    for name, number in wanted:
        matches |= Q(model__name=name, number=number)
    known = {(version.model.name, version.number): version for version in ModelVersion.objects.filter(matches).select_related("model")}
    return [(known[(entry["model"], entry["version"])], entry) for entry in entries if (entry["model"], entry["version"]) in known]


def add_to_rollup(version: ModelVersion, figures: dict, at: datetime | None = None) -> None:
    minute = (at or timezone.now()).replace(second=0, microsecond=0)
    with transaction.atomic():
        row, _ = VersionMetricMinute.objects.select_for_update().get_or_create(version=version, minute=minute)
        row.requests += int(figures.get("requests", 0))
        row.errors += int(figures.get("errors", 0))
        row.client_errors += int(figures.get("client_errors", 0))
        row.latency_sum_s += float(figures.get("latency_sum_s", 0.0))
        row.latency_buckets = _add_buckets(row.latency_buckets, figures.get("latency_buckets") or {})
        row.batch_size_buckets = _add_buckets(row.batch_size_buckets, figures.get("batch_size_buckets") or {})
        row.save()


def _add_buckets(total: dict, delta: dict) -> dict:
    merged = dict(total)
    for bound, count in delta.items():
        merged[bound] = merged.get(bound, 0) + int(count)
    return merged


def relay(worker: Worker, report: dict) -> None:
    message = {"type": "live.report", "worker": worker.worker_id, "generation": report.get("generation"), "digest": report.get("digest"),
               "versions": report.get("versions") or [],
               "state": report.get("state", "serving"), "at": timezone.now().isoformat()}
    try:
        async_to_sync(get_channel_layer().group_send)(LIVE_GROUP, message)
    except Exception:
        logger.debug("live relay failed", exc_info=True)
