"""A model's traffic over a past range, per version, for the charts to start from: the
last 15 minutes from the report samples (5-second buckets, fine enough to see a step
of a rollout), longer ranges from the per-minute roll-ups; and a marker for every
traffic change in the range, so "what happened when we moved to 50%" is one look.

Every version's figures share one time axis (bucket starts, Unix seconds) with a null
where a version has no figures in a bucket, which is how uPlot draws a gap.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils import timezone

from registry.domain.choices import ReleaseAction
from registry.domain.json_numbers import finite_or_null
from registry.domain.traffic import Route
from registry.models import RegisteredModel, Release, ReportSample, VersionMetricMinute
from serving.contract import quantile_ms


@dataclass(frozen=True)
class SeriesRange:
    name: str
    span_s: int
    step_s: int
    from_samples: bool  # else from the per-minute roll-ups


RANGES = {
    "15m": SeriesRange("15m", 15 * 60, 5, from_samples=True),
    "1h": SeriesRange("1h", 3600, 60, from_samples=False),
    "6h": SeriesRange("6h", 6 * 3600, 60, from_samples=False),
    "24h": SeriesRange("24h", 24 * 3600, 60, from_samples=False),
}
RECENT_BATCHES_S = 60
FIGURES = ("requests_per_s", "ok_per_s", "client_errors_per_s", "errors_per_s", "error_rate", "client_error_rate", "p50_ms", "p99_ms", "queue_depth")


class UnknownRange(ValueError):
    """A range this module does not offer; the message names the ones it does."""


def parse_range(raw: str | None, default: str = "15m") -> SeriesRange:
    name = default if raw in (None, "") else raw
    if name not in RANGES:
        raise UnknownRange(f"range must be one of {', '.join(RANGES)}; got {str(name)[:20]!r}")
    return RANGES[name]


def model_series(model: RegisteredModel, span: SeriesRange, now: datetime | None = None, version: int | None = None) -> dict:
    """``{model, range, step_s, start, end, t, versions: [{version, <FIGURES>: [...],
    batch_size_buckets}], markers}``."""
    now = now or timezone.now()
    end_s = now.timestamp()
    first_bucket = math.floor((end_s - span.span_s) / span.step_s) * span.step_s + span.step_s
    starts = list(range(int(first_bucket), int(end_s) + 1, span.step_s))
    totals = _sample_totals(model, span, starts, version) if span.from_samples else _minute_totals(model, starts, version)
    versions = sorted(set(totals) | _routed_now(model, version))
    return {
        "model": model.name,
        "range": span.name,
        "step_s": span.step_s,
        "start": starts[0],
        "end": end_s,
        "t": starts,
        "versions": [{"version": number, **_figures(totals.get(number, {}), starts, span.step_s, end_s),
                      "batch_size_buckets": _recent_batches(totals.get(number, {}), starts, end_s)} for number in versions],
        "markers": release_markers(model, _at(starts[0]), now),
    }


def _routed_now(model: RegisteredModel, version: int | None) -> set[int]:
    """Routed versions get a series even when silent, so the legend names them."""
    release = model.current_release()
    routed = set(release.routed_versions()) if release else set()
    return routed if version is None else routed & {version}


# ---------------------------------------------------------------- bucket totals


class Bucket:
    """What every report in one bucket said about one version, summed."""

    def __init__(self) -> None:
        self.requests = self.errors = self.client_errors = 0
        self.latency_buckets: dict[str, int] = defaultdict(int)
        self.batch_size_buckets: dict[str, int] = defaultdict(int)
        self.queue_depths: dict[str, list[int]] = defaultdict(list)  # worker -> depths it reported

    def add(self, figures: dict, worker: str | None = None) -> None:
        self.requests += int(figures.get("requests") or 0)
        self.errors += int(figures.get("errors") or 0)
        self.client_errors += int(figures.get("client_errors") or 0)
        for bound, count in (figures.get("latency_buckets") or {}).items():
            self.latency_buckets[bound] += int(count)
        for bound, count in (figures.get("batch_size_buckets") or {}).items():
            self.batch_size_buckets[bound] += int(count)
        if worker is not None and figures.get("queue_depth") is not None:
            self.queue_depths[worker].append(int(figures["queue_depth"]))

    def queue_depth(self) -> float | None:
        """Each worker's mean depth over the bucket, summed over workers (as the live view sums them)."""
        if not self.queue_depths:
            return None
        return round(sum(sum(depths) / len(depths) for depths in self.queue_depths.values()), 2)


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def _bucket_index(starts: list[int], step_s: int, at_s: float) -> int | None:
    index = math.floor((at_s - starts[0]) / step_s)
    return index if 0 <= index < len(starts) else None


def _sample_totals(model: RegisteredModel, span: SeriesRange, starts: list[int], version: int | None) -> dict[int, dict[int, Bucket]]:
    rows = ReportSample.objects.filter(version__model=model, received_at__gte=_at(starts[0]))
    if version is not None:
        rows = rows.filter(version__number=version)
    totals: dict[int, dict[int, Bucket]] = defaultdict(lambda: defaultdict(Bucket))
    for number, worker, received_at, figures in rows.values_list("version__number", "worker_id", "received_at", "figures").iterator():
        index = _bucket_index(starts, span.step_s, received_at.timestamp())
        if index is not None:
            totals[number][index].add(figures, worker)
    return totals


def _minute_totals(model: RegisteredModel, starts: list[int], version: int | None) -> dict[int, dict[int, Bucket]]:
    rows = VersionMetricMinute.objects.filter(version__model=model, minute__gte=_at(starts[0]))
    if version is not None:
        rows = rows.filter(version__number=version)
    totals: dict[int, dict[int, Bucket]] = defaultdict(lambda: defaultdict(Bucket))
    fields = ("requests", "errors", "client_errors", "latency_buckets", "batch_size_buckets")
    for number, minute, *values in rows.values_list("version__number", "minute", *fields).iterator():
        index = _bucket_index(starts, 60, minute.timestamp())
        if index is not None:
            totals[number][index].add(dict(zip(fields, values, strict=True)))
    return totals


def _figures(buckets: dict[int, Bucket], starts: list[int], step_s: int, end_s: float) -> dict[str, list]:
    columns: dict[str, list] = {name: [None] * len(starts) for name in FIGURES}
    for index, bucket in buckets.items():
        # The newest bucket is still filling: its rate is over the seconds it has had.
        seconds = max(min(step_s, end_s - starts[index]), 1.0)
        requests = bucket.requests
        row = {
            "requests_per_s": requests / seconds,
            "ok_per_s": (requests - bucket.errors - bucket.client_errors) / seconds,
            "client_errors_per_s": bucket.client_errors / seconds,
            "errors_per_s": bucket.errors / seconds,
            "error_rate": bucket.errors / requests if requests else None,
            "client_error_rate": bucket.client_errors / requests if requests else None,
            "p50_ms": quantile_ms(bucket.latency_buckets, 0.5),
            "p99_ms": quantile_ms(bucket.latency_buckets, 0.99),
            "queue_depth": bucket.queue_depth(),
        }
        for name, value in finite_or_null(row).items():
            columns[name][index] = round(value, 4) if isinstance(value, float) else value
    return columns


def _recent_batches(buckets: dict[int, Bucket], starts: list[int], end_s: float) -> dict[str, int]:
    """Batch sizes of the buckets started in the last RECENT_BATCHES_S: what the live
    batch-size chart shows, so it too starts full."""
    total: dict[str, int] = defaultdict(int)
    for index, bucket in buckets.items():
        if starts[index] >= end_s - RECENT_BATCHES_S:
            for bound, count in bucket.batch_size_buckets.items():
                total[bound] += count
    return dict(total)


# ---------------------------------------------------------------- release markers


def release_markers(model: RegisteredModel, start: datetime, end: datetime) -> list[dict]:
    """One marker per generation change of ``model`` in [start, end], oldest first."""
    releases = list(model.releases.filter(created_at__gte=start, created_at__lte=end).order_by("generation"))
    if not releases:
        return []
    previous = model.releases.filter(generation__lt=releases[0].generation).order_by("-generation").first()
    return [marker(release, before) for release, before in zip(releases, [previous, *releases[:-1]], strict=True)]


def marker(release: Release, previous: Release | None = None) -> dict:
    return {"t": release.created_at.timestamp(), "generation": release.generation, "action": release.action,
            "label": marker_label(release, previous), "routes": release.routes}


def marker_label(release: Release, previous: Release | None = None) -> str:
    """A few words for the line: "v2 50%", "promote v2", "rollback to v1", "archived";
    ``previous`` is the model's release before this one (an archive's end is "restored")."""
    routes = [Route.from_json(route) for route in release.routes]
    if release.is_archive:
        return "archived"
    if previous is not None and previous.is_archive:
        return f"restored {_short(routes, release.stable_version)}"
    if release.action == ReleaseAction.PROMOTE:
        return f"promote v{release.stable_version}"
    if release.action == ReleaseAction.ROLLBACK:
        return f"rollback to {_short(routes, release.stable_version)}"
    if release.action == ReleaseAction.RESTORE:
        return f"restore {_short(routes, release.stable_version)}"
    if release.action == ReleaseAction.INITIAL:
        return f"v{release.stable_version} first routed"
    return routes[0].describe() if len(routes) == 1 else _short(routes, release.stable_version)


def _short(routes: list[Route], stable_version: int) -> str:
    """A lone route is its version; a split is what the non-stable routes get."""
    if len(routes) == 1:
        return f"v{routes[0].version}" if routes[0].version == stable_version else routes[0].describe()
    others = [route.describe() for route in routes if route.version != stable_version]
    return ", ".join(others) or ", ".join(route.describe() for route in routes)
