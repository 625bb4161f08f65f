"""The once-a-second worker report (``contract.WorkerReport``): what changed in the
Prometheus metrics since the last report, per loaded version, plus identity, the
generation, digest and epoch served, and what is loaded.

Reading the prometheus-client metrics (rather than keeping a second set of counters)
keeps the request path untouched: the report costs one collect per second. Each version
entry also carries what the version answered (``outputs``, taken from its
``serving.output_summary``) and, on a shadow version, its comparisons since the previous
report (``shadow``), so the console can judge a canary against the stable version.
The per-version request figures are the traffic the split sent each version: requests
that named their version, and 504s under a client's own shorter deadline, are counted
apart (``serving.metrics``), so a client cannot make a canary look worse than it is.

A report the console refused as too soon (429: it stored nothing) is not counted as sent:
the next one carries its deltas too (``ReportBuilder.not_stored``).

A counter that went back (a version unloaded and loaded again between two reports)
starts its delta from zero, and no delta is ever negative: the contract refuses a
report with a negative count whole.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

from serving import metrics
from serving.contract import (
    MAX_LOADED,
    MAX_REPORTED_VERSIONS,
    LoadedEntry,
    WorkerIdentity,
    WorkerReport,
    quantile_ms,
)
from serving.shadow import COMPARISONS

logger = logging.getLogger("serving.reports")

Key = tuple[str, str]  # (model, version) as the metric labels spell them
SHADOW_FIGURES = ("compared", "agreed", "errors", "dropped")


def _no_figures() -> dict:
    return {"requests": 0.0, "errors": 0.0, "client_errors": 0.0, "latency_sum_s": 0.0,
            "latency_buckets": {}, "batch_size_buckets": {}, "queue_depth": 0.0}


def snapshot() -> dict[Key, dict]:
    """Cumulative figures per (model, version) from the worker's metrics."""
    metrics.flush_pending()
    figures: dict[Key, dict] = defaultdict(_no_figures)
    for sample in _samples(metrics.REQUESTS, "modelops_requests_total"):
        entry = figures[(sample.labels["model"], sample.labels["version"])]
        code = int(sample.labels["code"])
        entry["requests"] += sample.value
        entry["errors"] += sample.value if code >= 500 else 0
        entry["client_errors"] += sample.value if 400 <= code < 500 else 0
    for sample in _samples(metrics.REQUEST_LATENCY, "modelops_request_duration_seconds_bucket"):
        figures[_key(sample)]["latency_buckets"][sample.labels["le"]] = sample.value
    for sample in _samples(metrics.REQUEST_LATENCY, "modelops_request_duration_seconds_sum"):
        figures[_key(sample)]["latency_sum_s"] = sample.value
    for sample in _samples(metrics.BATCH_SIZE, "modelops_batch_size_bucket"):
        figures[_key(sample)]["batch_size_buckets"][sample.labels["le"]] = sample.value
    for sample in _samples(metrics.QUEUE_DEPTH, "modelops_queue_depth"):
        figures[_key(sample)]["queue_depth"] = sample.value
    return dict(figures)


def failed_total() -> int:
    """Requests answered with a server-side failure (5xx) since the worker started, routed,
    pinned or unrouted, and new connections answered 503 before a request was read (the
    listen queue's keeper while the loop could not take them, or past the connection cap):
    what a drill counts. A drill passed "0 failed requests" while a frozen worker's keeper
    answered 184 clients 503. A 504 under a deadline the client set shorter than the
    worker's is none: it is counted in none of the series read here."""
    metrics.flush_pending()
    answered = sum(sample.value for metric, name in ((metrics.REQUESTS, "modelops_requests_total"),
                                                     (metrics.PINNED_REQUESTS, "modelops_pinned_requests_total"))
                   for sample in _samples(metric, name) if int(sample.labels["code"]) >= 500)
    refused = sum(sample.value for sample in _samples(metrics.CONNECTIONS_REFUSED, "modelops_connections_refused_total"))
    return int(answered + refused)


def device_memory_bytes(device: str) -> int | None:
    """Memory in use on the inference device (NVML on a GPU, resident memory on CPU)."""
    metrics.update_device_memory(device)
    for sample in _samples(metrics.DEVICE_MEMORY, "modelops_device_memory_used_bytes"):
        if sample.labels["device"] == device:
            return int(sample.value)
    return None


def shadow_counts() -> dict[Key, dict]:
    """Cumulative shadow comparisons per shadow version: compared, agreed, errors, dropped."""
    totals: dict[Key, dict] = defaultdict(lambda: {"agree": 0, "disagree": 0, "error": 0, "dropped": 0})
    for sample in _samples(COMPARISONS, "modelops_shadow_comparisons_total"):
        totals[_key(sample)][sample.labels["result"]] = int(sample.value)
    return {key: {"compared": counts["agree"] + counts["disagree"], "agreed": counts["agree"], "errors": counts["error"],
                  "dropped": counts["dropped"]}
            for key, counts in totals.items()}


def shadow_totals(table) -> list[dict]:
    """``shadow_counts`` of the versions ``table`` mirrors to now, as the report's top-level
    list, by model and version, at most MAX_REPORTED_VERSIONS. Every version ever shadowed
    keeps its counters, and the 65th would have had every report refused."""
    mirrored = shadow_versions(table)
    counts = sorted((key, figures) for key, figures in shadow_counts().items() if key in mirrored)
    return [{"model": model, "version": int(version), **figures} for (model, version), figures in counts[:MAX_REPORTED_VERSIONS]]


def output_summaries(table) -> dict[Key, list[dict]]:
    """What each loaded version of the routing table answered since the previous call.
    Taking resets each summary: one report builder per worker reads them."""
    return {(name, str(version)): target.output_summary.take()
            for name, routes in table.models.items() for version, target in routes.targets.items()}


def shadow_versions(table) -> set[Key]:
    """The versions the routing table mirrors requests to now."""
    return {(name, str(version)) for name, routes in table.models.items() for version, _ in routes.shadows}


class ReportBuilder:
    def __init__(self) -> None:
        self._previous: dict[Key, dict] = {}
        self._previous_shadow: dict[Key, dict] = {}
        self._previous_at = time.monotonic()
        self._before_last = (self._previous, self._previous_shadow, self._previous_at)
        self._warned_too_many = False

    def build(self, identity: WorkerIdentity, repository, applied: dict | None = None, state: str = "serving") -> WorkerReport:
        """``applied``: the generation, digest and epoch of the state served, as acked;
        ``state``: serving, draining or stopped (serving.drain)."""
        now, table = time.monotonic(), repository.router.table
        current, shadows, outputs = snapshot(), shadow_counts(), output_summaries(table)
        interval_s = max(now - self._previous_at, 1e-6)
        versions = self._entries(current, shadows, outputs, shadow_versions(table), interval_s)
        self._before_last = (self._previous, self._previous_shadow, self._previous_at)
        self._previous, self._previous_shadow, self._previous_at = current, shadows, now
        applied = applied or {}
        return WorkerReport(
            worker=identity,
            generation=applied.get("generation") or repository.generation or 0,
            digest=applied.get("digest"),
            epoch=applied.get("epoch"),
            models=applied.get("models"),
            loaded=loaded_versions(repository),
            interval_s=round(interval_s, 3),
            versions=versions,
            requests_failed_total=failed_total(),
            shadow=tuple(shadow_totals(repository.router.table)),
            device_memory_bytes=device_memory_bytes(repository.device),
            state=state,
        )

    def not_stored(self) -> None:
        """The console stored nothing of the last report (it was too soon): the next one
        counts from the report before it, so its requests, errors and comparisons are
        reported once after all. Its output summaries are not given back."""
        self._previous, self._previous_shadow, self._previous_at = self._before_last

    def _entries(self, current: dict[Key, dict], shadows: dict[Key, dict], outputs: dict[Key, list], mirrored: set[Key],
                 interval_s: float) -> tuple[dict, ...]:
        """One entry per version with metrics, plus one per version with only outputs or
        shadow comparisons since the previous report. ``shadow`` is on the entry of a
        version mirrored to now, or compared since the previous report: a version that
        was a shadow once keeps its comparison counters, and they stop moving."""
        cumulative = {**dict.fromkeys(mirrored, dict.fromkeys(SHADOW_FIGURES, 0)), **shadows}  # counters appear at a first comparison
        shadow_deltas = {key: self._shadow_delta(key, counts) for key, counts in cumulative.items()}
        shadow_deltas = {key: delta for key, delta in shadow_deltas.items() if key in mirrored or any(delta.values())}
        keys = [key for key in current if key[0]]
        keys += sorted(key for key in {*outputs, *shadow_deltas} - set(current) if key[0] and (outputs.get(key) or key in shadow_deltas))
        entries = []
        for key in keys:
            entry = self._delta(key, current.get(key) or _no_figures(), interval_s)
            entry["outputs"] = outputs.get(key, [])
            if key in shadow_deltas:
                entry["shadow"] = shadow_deltas[key]
            entries.append(entry)
        return tuple(self._within_limit(entries))

    def _within_limit(self, entries: list[dict]) -> list[dict]:
        """The contract takes MAX_REPORTED_VERSIONS entries: past that, the busiest."""
        if len(entries) <= MAX_REPORTED_VERSIONS:
            return entries
        if not self._warned_too_many:
            logger.warning("%d versions have figures; the report carries the %d busiest", len(entries), MAX_REPORTED_VERSIONS)
            self._warned_too_many = True
        return sorted(entries, key=lambda entry: entry["requests"], reverse=True)[:MAX_REPORTED_VERSIONS]

    def _delta(self, key: Key, figures: dict, interval_s: float) -> dict:
        before = self._previous.get(key, {})
        if _went_back(figures, before):
            before = {}
        latency = _bucket_delta(figures["latency_buckets"], before.get("latency_buckets", {}))
        requests = _count_delta(figures["requests"], before.get("requests", 0.0))
        errors = min(requests, _count_delta(figures["errors"], before.get("errors", 0.0)))
        client_errors = min(requests - errors, _count_delta(figures["client_errors"], before.get("client_errors", 0.0)))
        return {
            "model": key[0],
            "version": int(key[1]),
            "requests": requests,
            "requests_per_s": round(requests / interval_s, 2),
            "ok": requests - errors - client_errors,
            "errors": errors,
            "client_errors": client_errors,
            "latency_sum_s": max(0.0, figures["latency_sum_s"] - before.get("latency_sum_s", 0.0)),
            "latency_buckets": latency,
            "batch_size_buckets": _bucket_delta(figures["batch_size_buckets"], before.get("batch_size_buckets", {})),
            "p50_ms": quantile_ms(latency, 0.5),
            "p99_ms": quantile_ms(latency, 0.99),
            "queue_depth": max(0, int(figures["queue_depth"])),
        }

    def _shadow_delta(self, key: Key, counts: dict) -> dict:
        before = self._previous_shadow.get(key, {})
        if any(counts[name] < before.get(name, 0) for name in SHADOW_FIGURES):
            before = {}
        return {name: counts[name] - before.get(name, 0) for name in SHADOW_FIGURES}


def loaded_versions(repository) -> tuple[LoadedEntry, ...]:
    """What the routing table holds loaded, routed versions first, at most MAX_LOADED: the
    console refuses a longer list (and with it the whole report)."""
    table = repository.router.table
    entries = [LoadedEntry(model=name, version=version, routed=version in routes.versions, ready=True)
               for name, routes in table.models.items() for version in sorted(routes.targets)]
    if len(entries) > MAX_LOADED:
        entries = sorted(entries, key=lambda entry: not entry.routed)[:MAX_LOADED]
    return tuple(entries)


def _went_back(figures: dict, before: dict) -> bool:
    """The counters restarted since ``before`` (their series were removed and made again)."""
    if figures["requests"] < before.get("requests", 0.0):
        return True
    return any(figures[name].get("+Inf", 0.0) < before.get(name, {}).get("+Inf", 0.0) for name in ("latency_buckets", "batch_size_buckets"))


def _count_delta(now: float, before: float) -> int:
    return max(0, int(now - before))


def _bucket_delta(now: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {bound: _count_delta(count, before.get(bound, 0.0)) for bound, count in now.items()}


def _key(sample) -> Key:
    return sample.labels["model"], sample.labels["version"]


def _samples(metric, name: str):
    for family in metric.collect():
        for sample in family.samples:
            if sample.name == name:
                yield sample
