"""The once-a-second worker report (``contract.WorkerReport``): what changed in the
Prometheus metrics since the last report, per loaded version, plus identity, the
generation, digest and epoch served, and what is loaded.

Reading the prometheus-client metrics (rather than keeping a second set of counters)
keeps the request path untouched: the report costs one collect per second.
"""

from __future__ import annotations

import time
from collections import defaultdict

from serving import metrics
from serving.contract import LoadedEntry, WorkerIdentity, WorkerReport
from serving.shadow import COMPARISONS

Key = tuple[str, str]  # (model, version) as the metric labels spell them


def snapshot() -> dict[Key, dict]:
    """Cumulative figures per (model, version) from the worker's metrics."""
    metrics.flush_pending()
    figures: dict[Key, dict] = defaultdict(lambda: {"requests": 0.0, "errors": 0.0, "client_errors": 0.0, "latency_sum_s": 0.0,
                                                   "latency_buckets": {}, "batch_size_buckets": {}, "queue_depth": 0.0})
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
    """Requests answered with a server-side failure (5xx) since the worker started."""
    metrics.flush_pending()
    return int(sum(sample.value for sample in _samples(metrics.REQUESTS, "modelops_requests_total") if int(sample.labels["code"]) >= 500))


def device_memory_bytes(device: str) -> int | None:
    """Memory in use on the inference device (NVML on a GPU, resident memory on CPU)."""
    metrics.update_device_memory(device)
    for sample in _samples(metrics.DEVICE_MEMORY, "modelops_device_memory_used_bytes"):
        if sample.labels["device"] == device:
            return int(sample.value)
    return None


def shadow_totals() -> list[dict]:
    """Cumulative shadow comparisons per shadow version: compared, agreed, errors, dropped."""
    totals: dict[Key, dict] = defaultdict(lambda: {"agree": 0, "disagree": 0, "error": 0, "dropped": 0})
    for sample in _samples(COMPARISONS, "modelops_shadow_comparisons_total"):
        totals[_key(sample)][sample.labels["result"]] = int(sample.value)
    return [
        {"model": model, "version": int(version), "compared": counts["agree"] + counts["disagree"], "agreed": counts["agree"],
         "errors": counts["error"], "dropped": counts["dropped"]}
        for (model, version), counts in sorted(totals.items())
    ]


def quantile_ms(buckets: dict[str, float], q: float) -> float | None:
    """Upper bound of the bucket holding quantile ``q`` of a cumulative histogram."""
    ordered = sorted(((float(bound), count) for bound, count in buckets.items()), key=lambda item: item[0])
    total = ordered[-1][1] if ordered else 0
    if total <= 0:
        return None
    previous_bound = 0.0
    for bound, count in ordered:
        if count >= q * total:
            return round((bound if bound != float("inf") else previous_bound) * 1000, 3)
        previous_bound = bound
    return None


class ReportBuilder:
    def __init__(self) -> None:
        self._previous: dict[Key, dict] = {}
        self._previous_at = time.monotonic()

    def build(self, identity: WorkerIdentity, repository, applied: dict | None = None) -> WorkerReport:
        """``applied``: the generation, digest and epoch of the state served, as acked."""
        now = time.monotonic()
        current = snapshot()
        interval_s = max(now - self._previous_at, 1e-6)
        versions = tuple(self._delta(key, figures, interval_s) for key, figures in current.items() if key[0])
        self._previous, self._previous_at = current, now
        applied = applied or {}
        return WorkerReport(
            worker=identity,
            generation=applied.get("generation") or repository.generation or 0,
            digest=applied.get("digest"),
            epoch=applied.get("epoch"),
            loaded=loaded_versions(repository),
            interval_s=round(interval_s, 3),
            versions=versions,
            requests_failed_total=failed_total(),
            shadow=tuple(shadow_totals()),
            device_memory_bytes=device_memory_bytes(repository.device),
        )

    def _delta(self, key: Key, figures: dict, interval_s: float) -> dict:
        before = self._previous.get(key, {})
        latency = _bucket_delta(figures["latency_buckets"], before.get("latency_buckets", {}))
        requests = figures["requests"] - before.get("requests", 0.0)
        return {
            "model": key[0],
            "version": int(key[1]),
            "requests": int(requests),
            "requests_per_s": round(requests / interval_s, 2),
            "errors": int(figures["errors"] - before.get("errors", 0.0)),
            "client_errors": int(figures["client_errors"] - before.get("client_errors", 0.0)),
            "latency_sum_s": figures["latency_sum_s"] - before.get("latency_sum_s", 0.0),
            "latency_buckets": latency,
            "batch_size_buckets": _bucket_delta(figures["batch_size_buckets"], before.get("batch_size_buckets", {})),
            "p50_ms": quantile_ms(latency, 0.5),
            "p99_ms": quantile_ms(latency, 0.99),
            "queue_depth": int(figures["queue_depth"]),
        }


def loaded_versions(repository) -> tuple[LoadedEntry, ...]:
    table = repository.router.table
    return tuple(
        LoadedEntry(model=name, version=version, routed=version in routes.versions, ready=True)
        for name, routes in table.models.items()
        for version in sorted(routes.targets)
    )


def _bucket_delta(now: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {bound: int(count - before.get(bound, 0.0)) for bound, count in now.items()}


def _key(sample) -> Key:
    return sample.labels["model"], sample.labels["version"]


def _samples(metric, name: str):
    for family in metric.collect():
        for sample in family.samples:
            if sample.name == name:
                yield sample
