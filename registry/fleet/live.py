"""Worker reports: per-minute roll-ups per version, and the live relay to browsers."""

from __future__ import annotations

import logging
import sys
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from registry.broadcast import send_to_group
from registry.fleet import samples
from registry.models import ModelVersion, VersionMetricMinute, Worker
from serving.contract import MAX_BUCKETS, MAX_COUNT, MAX_REPORTED_VERSIONS

logger = logging.getLogger(__name__)
LIVE_GROUP = "live"
MAX_ROLLUP_BOUNDS = 2 * MAX_BUCKETS  # bounds one minute's histogram keeps


def store_figures(worker: Worker, report: dict, received_at: datetime | None = None) -> None:
    """Roll the report's per-version figures up per minute and keep them as samples for the
    canary analysis and the charts, all or nothing: a worker sends again the figures of a
    report answered 503, so none of them may have been kept. The figures were validated
    with the report (``serving.contract``); versions this console does not know are skipped.
    ``received_at`` is now, unless a test replays a report at another moment."""
    at = received_at or timezone.now()
    resolved = _resolve_versions(report.get("versions") or [])
    with transaction.atomic():
        # One lock order for every report, so two reports never wait for each other's rows.
        for version, figures in sorted(resolved, key=lambda pair: pair[0].pk):
            add_to_rollup(version, figures, at)
        samples.store(worker.worker_id, resolved, at)


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
        # Each report's figures are within the contract's bounds, but a minute adds many:
        # a total past the 64-bit columns failed the report's whole write. It stays at the bound.
        row.requests = _capped(row.requests, int(figures.get("requests", 0)))
        row.errors = _capped(row.errors, int(figures.get("errors", 0)))
        row.client_errors = _capped(row.client_errors, int(figures.get("client_errors", 0)))
        row.latency_sum_s = min(row.latency_sum_s + float(figures.get("latency_sum_s", 0.0)), sys.float_info.max)
        row.latency_buckets = _add_buckets(row.latency_buckets, figures.get("latency_buckets") or {})
        row.batch_size_buckets = _add_buckets(row.batch_size_buckets, figures.get("batch_size_buckets") or {})
        row.save()


def _add_buckets(total: dict, delta: dict) -> dict:
    """A minute's histogram plus one report's. Its bounds stop growing at MAX_ROLLUP_BOUNDS
    (a worker's histograms have a fixed 15 or so): reports of 31 new bounds each had grown
    one row without end, every report rewriting it whole (17 → 108 ms a report)."""
    merged = dict(total)
    for bound, count in delta.items():
        if bound in merged or bound == "+Inf" or len(merged) < MAX_ROLLUP_BOUNDS:
            merged[bound] = _capped(merged.get(bound, 0), int(count))
    return merged


def _capped(total: int, delta: int) -> int:
    return min(total + delta, MAX_COUNT)


# A page reads one model's digest from each report (a drill's progress): more than a
# report's version entries would be sent to every open page once a second per worker.
MAX_RELAYED_MODELS = MAX_REPORTED_VERSIONS


def _relayed_models(models: object) -> dict | None:
    return models if isinstance(models, dict) and len(models) <= MAX_RELAYED_MODELS else None


# What a page reads of a relayed report's version entry (static/js/console.js's reportBook,
# model.js's batch sizes). The whole entry was relayed: with its output summaries (16 of
# 256 values each), a report of 64 versions is 2.3 MB, sent through Redis to every open
# feed; one worker id at its report rate and four viewers' feeds took a light API request
# from about 0.4 s to 1.0 s (median) on 2 cores, 84 MB sent to the feeds in 20 s.
RELAYED_FIGURES = ("model", "version", "requests", "errors", "client_errors", "requests_per_s", "p50_ms", "p99_ms", "queue_depth",
                   "batch_size_buckets")


def _relayed_versions(versions: object) -> list[dict]:
    if not isinstance(versions, list):
        return []
    return [{key: entry[key] for key in RELAYED_FIGURES if key in entry} for entry in versions if isinstance(entry, dict)]


def relay(worker: Worker, report: dict) -> None:
    message = {"type": "live.report", "worker": worker.worker_id, "generation": report.get("generation"), "digest": report.get("digest"),
               "models": _relayed_models(report.get("models")), "versions": _relayed_versions(report.get("versions")),
               "state": report.get("state", "serving"), "at": timezone.now().isoformat()}
    try:
        send_to_group(LIVE_GROUP, message)
    except Exception:
        logger.debug("live relay failed", exc_info=True)
