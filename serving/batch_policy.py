"""The batching policy: what to send, how long to wait, and what a queue can still take.

`next_batch` is a pure function of the queue, the clock, whether the engine is idle and
the learned latency model, in the manner of Triton's GetDynamicBatch: it says which
requests to drop (past their deadline), how many to send now and how long to wait
otherwise. `predicted_delay_s` is the admission side: how long a new request would wait
for its answer, from the same latency model and from the pace the queue really drained
at (`QueuePace`). Nothing here waits, runs a model or touches a future.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the policy's settings; a type only, so no import cycle with the queue
    from serving.contract import BatchPolicy


@dataclass(slots=True, eq=False)
class PendingRequest:
    inputs: tuple[np.ndarray, ...]  # one array per model input, batch axis first
    rows: int
    enqueued_s: float  # monotonic clock
    deadline_s: float  # monotonic clock
    future: asyncio.Future
    request_id: str = ""
    summarised: bool = True  # False: its outputs stay out of the version's output summary (a pinned request)


class LatencyModel:
    """Batch time ≈ per_row_s·rows + fixed_s, least squares over the last `window` batches.

    Running sums make `observe` O(1); before two distinct batch sizes are seen the
    model is proportional (fixed_s = 0), and before any sample it predicts 0.
    """

    def __init__(self, window: int = 128):
        self._samples: deque[tuple[int, float]] = deque()
        self._window = window
        self._sum_n = self._sum_t = self._sum_nn = self._sum_nt = 0.0
        self.per_row_s = 0.0
        self.fixed_s = 0.0

    @property
    def is_known(self) -> bool:
        return bool(self._samples)

    def observe(self, rows: int, seconds: float) -> None:
        if len(self._samples) == self._window:
            self._add(*self._samples.popleft(), sign=-1.0)
        self._samples.append((rows, seconds))
        self._add(rows, seconds, sign=1.0)
        self._fit()

    def predict_s(self, rows: int) -> float:
        return self.per_row_s * rows + self.fixed_s

    def _add(self, rows: int, seconds: float, sign: float) -> None:
        self._sum_n += sign * rows
        self._sum_t += sign * seconds
        self._sum_nn += sign * rows * rows
        self._sum_nt += sign * rows * seconds

    def _fit(self) -> None:
        count = len(self._samples)
        variance = count * self._sum_nn - self._sum_n**2
        if variance > 1e-9 * max(1.0, self._sum_nn):
            slope = (count * self._sum_nt - self._sum_n * self._sum_t) / variance
            self.per_row_s = max(slope, 0.0)
            self.fixed_s = max((self._sum_t - self.per_row_s * self._sum_n) / count, 0.0)
        else:  # one batch size only: no way to split fixed from per-row cost
            self.per_row_s = max(self._sum_t / max(self._sum_n, 1.0), 0.0)
            self.fixed_s = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    dropped: tuple[int, ...] = ()  # queue indices that cannot make their deadline: 504, not computed
    send_count: int = 0  # after removing `dropped`, send this many from the front now
    wait_s: float | None = None  # else wait this long (None: until an arrival or the engine frees)


def next_batch(
    queue: Sequence[PendingRequest],
    now_s: float,
    is_engine_idle: bool,
    policy: BatchPolicy,
    latency: LatencyModel,
    expected_gap_s: float = math.inf,
) -> Decision:
    """The batching policy. Pure: the same arguments always give the same decision.

    Scans the queue front to back, only as far as the next batch could reach.
    `expected_gap_s` is the expected time to the next arrival (inf: nothing is coming).
    """
    dropped, rows, count, is_full, wake_s = [], 0, 0, False, math.inf
    oldest, earliest_deadline_s = None, math.inf
    for index, request in enumerate(queue):
        finish_alone_s = now_s + latency.predict_s(request.rows)
        if request.deadline_s <= finish_alone_s:
            dropped.append(index)
            continue
        if rows + request.rows > policy.max_batch_size:
            if count == 0:
                # Larger than the whole batch: admitted before the policy shrank it. It goes
                # alone; left at the front, it would hold the queue behind it for ever.
                rows, count, oldest, earliest_deadline_s = request.rows, 1, request, request.deadline_s
                wake_s = min(wake_s, request.deadline_s - latency.predict_s(request.rows) - now_s)
            is_full = True
            break
        rows += request.rows
        count += 1
        oldest = oldest or request
        earliest_deadline_s = min(earliest_deadline_s, request.deadline_s)
        wake_s = min(wake_s, request.deadline_s - latency.predict_s(request.rows) - now_s)
        if rows == policy.max_batch_size:
            is_full = True
            break
    if count == 0:
        return Decision(tuple(dropped))
    if not is_engine_idle:
        # Wait for the engine; wake in time to drop whoever would miss its deadline.
        return Decision(tuple(dropped), 0, wake_s if wake_s != math.inf else None)
    wait_s = 0.0 if is_full else _worth_waiting_s(oldest, earliest_deadline_s, rows, now_s, policy, latency,
                                                  expected_gap_s)
    return Decision(tuple(dropped), count if wait_s <= 0.0 else 0, wait_s if wait_s > 0.0 else None)


def _worth_waiting_s(oldest, earliest_deadline_s, rows, now_s, policy, latency, expected_gap_s) -> float:
    """How long waiting for more rows still pays (0 = send now): never past the window of
    the oldest request, nor so long that the batch with one more row would finish after
    the earliest deadline in it (any request's, not only the oldest's)."""
    remaining_s = oldest.enqueued_s + policy.max_queue_delay_s - now_s
    if remaining_s <= 0.0 or expected_gap_s >= remaining_s:
        return 0.0  # window over, or the next request would not arrive within it
    finish_with_one_more_s = latency.predict_s(rows + 1)
    budget_s = earliest_deadline_s - now_s - finish_with_one_more_s
    if policy.latency_target_s is not None:
        budget_s = min(budget_s, oldest.enqueued_s + policy.latency_target_s - now_s - finish_with_one_more_s)
    return max(min(remaining_s, budget_s), 0.0)


def admission_delay_s(
    queued_rows: int, rows: int, busy_remaining_s: float, policy: BatchPolicy, latency: LatencyModel
) -> float:
    """Predicted time from now until a new request of `rows` rows is answered."""
    total_rows = queued_rows + rows
    batches = math.ceil(total_rows / policy.max_batch_size)
    full_batch_rows = min(total_rows, policy.max_batch_size)
    return busy_remaining_s + batches * latency.predict_s(full_batch_rows)


class QueuePace:
    """What one queue has measured of its own traffic: the gap between arrivals (does
    waiting for company pay?) and the rate it drained at while requests kept waiting
    (how long will a newcomer wait?)."""

    __slots__ = ("_backlog_since_s", "_gap_ewma_s", "_is_arrival_while_busy", "_was_arrival_while_busy",
                 "backlog_rows_per_s", "busy_since_s", "last_arrival_s")

    def __init__(self) -> None:
        self.last_arrival_s = -math.inf
        self.busy_since_s = 0.0  # when the batch running now was sent
        self.backlog_rows_per_s = 0.0  # rows answered per second while requests kept waiting
        self._gap_ewma_s = math.inf
        self._backlog_since_s: float | None = None  # the last completion that left requests waiting
        self._is_arrival_while_busy = False  # during the batch running now
        self._was_arrival_while_busy = False  # during the last batch that finished

    def arrived(self, now_s: float, is_busy: bool) -> None:
        gap_s = now_s - self.last_arrival_s
        self.last_arrival_s = now_s
        self._gap_ewma_s = gap_s if self._gap_ewma_s == math.inf else 0.8 * self._gap_ewma_s + 0.2 * gap_s
        if is_busy:
            self._is_arrival_while_busy = True

    def batch_sent(self, now_s: float) -> None:
        self.busy_since_s = now_s
        self._is_arrival_while_busy = False

    def batch_returned(self) -> None:
        self._was_arrival_while_busy = self._is_arrival_while_busy

    def expected_gap_s(self) -> float:
        """Expected time to the next arrival; inf when nothing arrived during the last batch
        (closed-loop or low load: the next request waits for our answer, so don't wait for it)."""
        return self._gap_ewma_s if self._was_arrival_while_busy else math.inf

    def drained(self, rows: int, now_s: float, is_backlogged: bool) -> None:
        """Measure the drain rate only between completions that left requests waiting:
        then the rate is the pace of the whole path, not the pace of arrivals."""
        if self._backlog_since_s is not None and now_s > self._backlog_since_s:
            rate = rows / (now_s - self._backlog_since_s)
            self.backlog_rows_per_s = rate if self.backlog_rows_per_s == 0.0 else 0.8 * self.backlog_rows_per_s + 0.2 * rate
        self._backlog_since_s = now_s if is_backlogged else None


def predicted_delay_s(
    rows: int, now_s: float, queued_rows: int, is_busy: bool, pace: QueuePace, policy: BatchPolicy,
    latency: LatencyModel,
) -> float:
    """Time until a new request of `rows` rows would be answered: the compute the latency
    model predicts for what is ahead of it, or, when the queue has been backlogged, what
    is ahead of it at the rate the queue really drained (Little's law). The second counts
    what the model cannot see: under thousands of connections the event loop, not ONNX
    Runtime, sets the pace."""
    busy_remaining_s = 0.0
    if is_busy:
        busy_remaining_s = max(latency.predict_s(policy.max_batch_size) - (now_s - pace.busy_since_s), 0.0)
    delay_s = admission_delay_s(queued_rows, rows, busy_remaining_s, policy, latency)
    if pace.backlog_rows_per_s > 0.0 and queued_rows:
        delay_s = max(delay_s, (queued_rows + rows) / pace.backlog_rows_per_s)
    return delay_s
