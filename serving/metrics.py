"""Prometheus metrics of a serving worker: module-level, base units, bounded labels.

Labels are (model, version) of *loaded* versions only, plus the status code; a request
for an unknown model is counted under model="" so clients cannot grow the label set.
The hot path uses a `VersionMetrics` that caches the labelled children once per version.

Per-request figures (status count, request latency) are not written to prometheus-client
one by one: each costs two to three lock round trips and a Python scan of the buckets
(~3 % of the event loop at 3k req/s). `record` appends to a pending list instead, and
`flush_pending()` folds it in, one `inc` per touched bucket and code. Every reader
flushes first (`/metrics`, `/health`, the worker report), and a list flushes itself at
`PENDING_LIMIT` entries, so readers always see every answered request.

`InferenceStats` holds the cumulative figures of Triton's statistics extension for one
version (`serving.triton` renders them). They are folded where the figures above are:
success and fail at the flush of the pending list, queue and compute once per batch by
the batch observer, so the request path pays nothing more for them.

`modelops_requests_total` and the latency histogram of a version hold the traffic the
split sent it: they are what the worker reports carry, hence what the console's charts and
the canary analysis judge. Two kinds of request are counted apart, so that a client cannot
make a version look worse than the traffic it was given: a request that named its version
or chose it by an X-Routing-Key no gateway vouches for (pinned:
`modelops_pinned_requests_total`; `SERVING_TRUST_ROUTING_KEY`), and a 504 under a deadline the client set
shorter than the worker's own (`modelops_client_deadline_refusals_total`, pinned or not;
no failure of the worker's). Triton's statistics count every request a version answered.
"""

from __future__ import annotations

import resource
from bisect import bisect_left
from collections import Counter as Tally

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.5, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

REQUESTS = Counter("modelops_requests", "Inference requests answered, by status code.", ["model", "version", "code"])
REQUEST_LATENCY = Histogram(
    "modelops_request_duration_seconds", "Time from request read to response.", ["model", "version"],
    buckets=LATENCY_BUCKETS_S,
)
PINNED_REQUESTS = Counter(
    "modelops_pinned_requests",
    "Inference requests that named their version (/v2/models/{m}/versions/{v}/infer, /predict with version), or chose it "
    "with an X-Routing-Key (unless SERVING_TRUST_ROUTING_KEY), by status code; not in modelops_requests_total, which holds "
    "what the traffic split sent each version.",
    ["model", "version", "code"],
)
CLIENT_DEADLINE_REFUSALS = Counter(
    "modelops_client_deadline_refusals",
    "Requests answered 504 because they could not make a deadline the client set shorter than SERVING_REQUEST_TIMEOUT_S "
    "(X-Request-Timeout-S, parameters.timeout); not in modelops_requests_total nor among the worker's failures.",
    ["model", "version"],
)
QUEUE_TIME = Histogram(
    "modelops_queue_duration_seconds", "Time a request waited in the batch queue.", ["model", "version"],
    buckets=LATENCY_BUCKETS_S,
)
COMPUTE_TIME = Histogram(
    "modelops_compute_duration_seconds", "Time of one batch in ONNX Runtime.", ["model", "version"],
    buckets=LATENCY_BUCKETS_S,
)
BATCH_SIZE = Histogram("modelops_batch_size", "Rows per executed batch.", ["model", "version"], buckets=BATCH_BUCKETS)
QUEUE_DEPTH = Gauge("modelops_queue_depth", "Requests waiting in batch queues.", ["model", "version"])
LOADED_VERSIONS = Gauge("modelops_loaded_versions", "Model versions loaded and warm in this worker.")
STATE_GENERATION = Gauge("modelops_state_generation", "Generation of the desired state this worker last applied.")
DEVICE_MEMORY = Gauge("modelops_device_memory_used_bytes", "Memory in use on the inference device.", ["device"])
CONNECTIONS_REFUSED = Counter(
    "modelops_connections_refused",
    "New connections answered 503 before any request was read, by who refused: the listen queue's keeper "
    "(the event loop could not take them in time) or the worker (past SERVING_MAX_CONNECTIONS).",
    ["by"],
)
# Both children exist from the start, so a rate() over them never begins with a missing series.
_REFUSED_BY_KEEPER = CONNECTIONS_REFUSED.labels("keeper")
_REFUSED_BY_WORKER = CONNECTIONS_REFUSED.labels("worker")


PENDING_LIMIT = 2048
_WITH_PENDING: set = set()  # VersionMetrics (and the unrouted tally) holding unflushed records


def observe_many(child, values) -> float:
    """`child.observe(v)` for every v, with one lock round trip per touched bucket; returns
    the values' sum (the statistics want it too)."""
    bounds, buckets, total = getattr(child, "_upper_bounds", None), getattr(child, "_buckets", None), getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:  # another prometheus-client layout
        for value in values:
            child.observe(value)
        return sum(values)
    counts = Tally(bisect_left(bounds, value) for value in values)
    for index, count in counts.items():
        buckets[index].inc(count)
    values_sum = sum(values)
    total.inc(values_sum)
    return values_sum


class BatchSizeStats:
    """Batches run whole at one size (rows) and their time in ONNX Runtime."""

    __slots__ = ("compute_s", "count")

    def __init__(self) -> None:
        self.count, self.compute_s = 0, 0.0


class InferenceStats:
    """One version's cumulative figures for Triton's statistics extension.

    Durations are kept as float seconds (within nanoseconds over months of traffic)
    and shown in integer nanoseconds. Queue and compute figures cover the requests of
    batches that ran whole; a batch split after a failure is not one execution.
    """

    __slots__ = ("batches", "by_batch_size", "compute_request_s", "fail_count", "fail_s", "last_batch_s",
                 "queue_s", "queued_requests", "rows", "success_count", "success_s")

    def __init__(self) -> None:
        self.success_count = self.fail_count = self.batches = self.rows = self.queued_requests = 0
        self.success_s = self.fail_s = self.queue_s = self.compute_request_s = 0.0
        self.last_batch_s: float | None = None  # monotonic clock, as the batcher's
        self.by_batch_size: dict[int, BatchSizeStats] = {}

    def batch_ran(self, requests: int, rows: int, queue_s: float, compute_s: float, started_s: float) -> None:
        """A batch that ran whole: its requests waited `queue_s` in all, and each is charged
        the batch's whole compute time, as Triton charges every request of a batch."""
        self.batches += 1
        self.rows += rows
        self.queued_requests += requests
        self.queue_s += queue_s
        self.compute_request_s += compute_s * requests
        self.last_batch_s = started_s
        size = self.by_batch_size.get(rows)
        if size is None:
            size = self.by_batch_size[rows] = BatchSizeStats()
        size.count += 1
        size.compute_s += compute_s

    def answered(self, codes: list[int], latencies_s: list[float], tally: Tally, latency_sum_s: float) -> None:
        """Fold a flushed pending list (`tally`: its codes counted): 200 is a success, any
        other status a failure."""
        failed = len(codes) - tally.get(200, 0)
        fail_s = _failures_latency_s(codes, latencies_s, tally) if failed else 0.0
        self.success_count += len(codes) - failed
        self.success_s += latency_sum_s - fail_s
        self.fail_count += failed
        self.fail_s += fail_s

    def answered_one(self, code: int, latency_s: float) -> None:
        """One request counted apart from the pending list (pinned, or past the client's deadline)."""
        if code == 200:
            self.success_count += 1
            self.success_s += latency_s
        else:
            self.fail_count += 1
            self.fail_s += latency_s


def _failures_latency_s(codes: list[int], latencies_s: list[float], tally: Tally) -> float:
    """The latencies of the non-200 entries, found by `list.index` (a scan in C): the Python
    steps are one per failure, not one per request, and most flushes hold no failure."""
    total_s = 0.0
    for code, count in tally.items():
        if code == 200:
            continue
        at = -1
        for _ in range(count):
            at = codes.index(code, at + 1)
            total_s += latencies_s[at]
    return total_s


class VersionMetrics:
    """The labelled children of one loaded version, looked up once."""

    def __init__(self, model_name: str, version: int):
        labels = (model_name, str(version))
        self.labels = labels
        self.request_latency = REQUEST_LATENCY.labels(*labels)
        self.queue_time = QUEUE_TIME.labels(*labels)
        self.compute_time = COMPUTE_TIME.labels(*labels)
        self.batch_size = BATCH_SIZE.labels(*labels)
        self.queue_depth = QUEUE_DEPTH.labels(*labels)
        self.stats = InferenceStats()
        self._requests_by_code: dict[int, Counter] = {}
        self._pinned_by_code: dict[int, Counter] = {}
        self._client_deadline_refusals: Counter | None = None
        self._codes: list[int] = []  # pending, not yet in prometheus-client
        self._latencies_s: list[float] = []

    def record(self, code: int, latency_s: float) -> None:
        """One answered request: its status and its latency (folded in on the next flush)."""
        self._codes.append(code)
        self._latencies_s.append(latency_s)
        if len(self._codes) == 1:
            _WITH_PENDING.add(self)
        elif len(self._codes) >= PENDING_LIMIT:
            self.flush()

    def flush(self) -> None:
        codes, latencies_s = self._codes, self._latencies_s
        if not codes:
            return
        self._codes, self._latencies_s = [], []
        _WITH_PENDING.discard(self)
        tally = Tally(codes)
        for code, count in tally.items():
            self._child(code).inc(count)
        self.stats.answered(codes, latencies_s, tally, observe_many(self.request_latency, latencies_s))

    def record_pinned(self, code: int, latency_s: float) -> None:
        """A request that named this version: counted at once in its own series (pinned
        requests are no part of the hot path), outside what the reports carry."""
        child = self._pinned_by_code.get(code)
        if child is None:
            child = self._pinned_by_code[code] = PINNED_REQUESTS.labels(*self.labels, str(code))
        child.inc()
        self.stats.answered_one(code, latency_s)

    def record_client_deadline_refusal(self, latency_s: float) -> None:
        """A 504 under the client's own, shorter deadline: outside the reports and the failures."""
        if self._client_deadline_refusals is None:
            self._client_deadline_refusals = CLIENT_DEADLINE_REFUSALS.labels(*self.labels)
        self._client_deadline_refusals.inc()
        self.stats.answered_one(504, latency_s)

    def _child(self, code: int) -> Counter:
        child = self._requests_by_code.get(code)
        if child is None:
            child = self._requests_by_code[code] = REQUESTS.labels(*self.labels, str(code))
        return child

    def remove(self) -> None:
        """Forget the series of an unloaded version so labels stay bounded."""
        self._codes, self._latencies_s = [], []
        _WITH_PENDING.discard(self)
        for metric in (REQUEST_LATENCY, QUEUE_TIME, COMPUTE_TIME, BATCH_SIZE, QUEUE_DEPTH):
            _remove_quietly(metric, self.labels)
        for code in self._requests_by_code:
            _remove_quietly(REQUESTS, (*self.labels, str(code)))
        for code in self._pinned_by_code:
            _remove_quietly(PINNED_REQUESTS, (*self.labels, str(code)))
        if self._client_deadline_refusals is not None:
            _remove_quietly(CLIENT_DEADLINE_REFUSALS, self.labels)


def _remove_quietly(metric, labels) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass


_UNROUTED_BY_CODE: dict[int, Counter] = {}


def count_unrouted(code: int) -> None:
    """Count a request that never reached a version (unknown model, bad body...)."""
    child = _UNROUTED_BY_CODE.get(code)
    if child is None:
        child = _UNROUTED_BY_CODE[code] = REQUESTS.labels("", "", str(code))
    child.inc()


_refused_connections_counted = [0]


def count_refused_connections(total: int) -> None:
    """Bring the counter up to the keepers' running total (serving/listen_queue.py)."""
    delta = total - _refused_connections_counted[0]
    if delta > 0:
        _REFUSED_BY_KEEPER.inc(delta)
        _refused_connections_counted[0] = total


def count_connection_refused_at_cap() -> None:
    """A connection the event loop accepted past the cap (the keeper lets a few through
    between its looks at the count) and answered 503 itself."""
    _REFUSED_BY_WORKER.inc()


def flush_pending() -> None:
    """Fold every pending per-request record into prometheus-client (call before reading)."""
    for pending in list(_WITH_PENDING):
        pending.flush()


def update_device_memory(device: str) -> None:
    """Called on scrape: NVML on a GPU; the process resident memory on CPU."""
    if device.startswith("cuda:"):
        used = _nvml_used_bytes(int(device.split(":", 1)[1]))
        if used is not None:
            DEVICE_MEMORY.labels(device).set(used)
        return
    DEVICE_MEMORY.labels(device).set(_resident_bytes())


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _nvml_used_bytes(index: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # NVML missing or driver mismatch: the gauge just stays unset
        return None
