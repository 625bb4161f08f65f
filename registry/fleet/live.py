"""Worker reports: per-minute roll-ups per version, and the live relay to browsers."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone

from registry.models import ModelVersion, VersionMetricMinute, Worker

logger = logging.getLogger(__name__)
LIVE_GROUP = "live"


def ingest_report(worker: Worker, report: dict) -> None:
    for figures in report.get("versions") or []:
        try:
            add_to_rollup(figures)
        except (KeyError, TypeError, ValueError):
            logger.warning("ignored malformed version figures from %s", worker.worker_id)
    relay(worker, report)


def add_to_rollup(figures: dict) -> None:
    version = ModelVersion.objects.filter(model__name=figures["model"], number=int(figures["version"])).first()
    if version is None:
        return
    minute = timezone.now().replace(second=0, microsecond=0)
    with transaction.atomic():
        row, _ = VersionMetricMinute.objects.select_for_update().get_or_create(version=version, minute=minute)
        row.requests += int(figures.get("requests", 0))
        row.errors += int(figures.get("errors", 0))
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
    message = {"type": "live.report", "worker": worker.worker_id, "generation": report.get("generation"), "versions": report.get("versions") or [], "at": timezone.now().isoformat()}
    try:
        async_to_sync(get_channel_layer().group_send)(LIVE_GROUP, message)
    except Exception:  # noqa: BLE001 - live charts are best effort; the roll-ups are kept
        logger.debug("live relay failed", exc_info=True)
