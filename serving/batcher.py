"""Dynamic batching: one bounded FIFO queue per version and non-batch shape.

`next_batch` is the policy, a pure function of the queue, the clock, whether the engine
is idle and the learned latency model, in the manner of Triton's GetDynamicBatch: it
says which requests to drop (past their deadline), how many to send now and how long to
wait otherwise. `Batcher` only waits on an asyncio Event (with a timer, never a poll)
and hands batches to a thread, where ONNX Runtime runs without the GIL.

A batch whose run fails, or whose outputs do not have one row per input row, is split
in halves and run again (`run_batch`), so one bad request fails alone and the others get
their answers. A version not proven batchable never has requests concatenated.

The hand-off is a `DispatchThreads`: long-lived threads per loaded version that take
batches from a queue and deliver each batch's results to the loop in ONE
`call_soon_threadsafe`. On a 2-core box that round trip costs about half of a
`run_in_executor` one (no concurrent.futures.Future, no work item, no chained asyncio
future); a plain `Executor` is still accepted (SERVING_DISPATCH=executor).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import orjson

from serving.contract import BatchPolicy
from serving.metrics import observe_many
from serving.errors import BadRequest, DeadlineExceeded, ModelFailed, NotReady, QueueFull, ServingError

logger = logging.getLogger("serving.batcher")

Outputs = tuple[np.ndarray, ...]
RunFn = Callable[[Outputs], Sequence[np.ndarray]]  # model inputs in order -> outputs in order


@dataclass(slots=True, eq=False)
class PendingRequest:
    inputs: Outputs  # one array per model input, batch axis first
    rows: int
    enqueued_s: float  # monotonic clock
    deadline_s: float  # monotonic clock
    future: asyncio.Future
    request_id: str = ""


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


class OutputRowsMismatch(Exception):
    """A run's output does not have one row per input row, so it cannot be sliced back."""

    def __init__(self, output_index: int, rows: int, shape: tuple):
        super().__init__(f"output {output_index} has shape {list(shape)} for {rows} input rows")
        self.output_index, self.rows, self.shape = output_index, rows, shape


def run_batch(
    run: RunFn, requests: Sequence[PendingRequest], is_batchable: bool = True
) -> tuple[list[Outputs | Exception], float | None]:
    """One run over the requests concatenated along the batch axis, outputs sliced back.

    Returns (results, compute_s). When the run fails, or its outputs do not have one row
    per input row, the batch is split in halves and each is run again, so one bad request
    fails alone and the others still get their answers: `results[i]` is then request i's
    outputs or the exception it failed with on its own, and `compute_s` is None (a split
    batch's time says nothing about the model's speed).
    """
    if len(requests) > 1 and not is_batchable:  # rows of different clients would mix: each runs alone
        return _run_halves(run, requests, is_batchable), None
    try:
        return _run_together(run, requests, is_batchable)
    except Exception as exc:  # ORT raises its own classes; the split tells whose input it was
        if len(requests) == 1:
            return [exc], None
        return _run_halves(run, requests, is_batchable), None


def _run_halves(run: RunFn, requests: Sequence[PendingRequest], is_batchable: bool) -> list[Outputs | Exception]:
    """Bisect a failed batch: about 2·log2(n) runs find one bad request among n."""
    middle = len(requests) // 2
    results: list[Outputs | Exception] = []
    for half in (requests[:middle], requests[middle:]):
        results.extend(run_batch(run, half, is_batchable)[0])
    return results


def _run_together(run: RunFn, requests: Sequence[PendingRequest], is_batchable: bool) -> tuple[list[Outputs], float]:
    if len(requests) == 1:
        feeds = requests[0].inputs
    else:
        feeds = tuple(np.concatenate(parts) for parts in zip(*(request.inputs for request in requests)))
    started_s = time.perf_counter()
    outputs = run(feeds)
    compute_s = time.perf_counter() - started_s
    if not is_batchable:
        return [tuple(outputs)], compute_s
    rows = sum(request.rows for request in requests)
    for index, output in enumerate(outputs):
        if output.shape[:1] != (rows,):  # reduced over the batch, or another axis first
            raise OutputRowsMismatch(index, rows, output.shape)
    results, start = [], 0
    for request in requests:
        stop = start + request.rows
        results.append(tuple(output[start:stop] for output in outputs))  # views, no copies
        start = stop
    return results, compute_s


class DispatchThreads:
    """Long-lived threads that run one engine's batches (ORT off the event loop).

    `submit(loop, fn, args, callback)` queues a job; a thread runs `fn(*args)` and calls
    `callback(error, result)` on `loop` through one `call_soon_threadsafe`. `nice` > 0
    lowers the threads' scheduling priority (Linux, per thread) so that on a CPU-bound
    box the event loop, which accepts, sheds and answers, wins the core over compute.
    """

    def __init__(self, name: str, threads: int = 1, nice: int = 0):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._nice = nice
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True) for index in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, loop: asyncio.AbstractEventLoop, fn: Callable, args: tuple, callback: Callable) -> None:
        self._jobs.put((loop, fn, args, callback))

    def close(self) -> None:
        """Let each thread finish what was queued before, then end."""
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        lower_priority(self._nice)
        while (job := self._jobs.get()) is not None:
            loop, fn, args, callback = job
            try:
                error, result = None, fn(*args)
            except BaseException as exc:  # delivered to the loop, which fails that batch only
                error, result = exc, None
            try:
                loop.call_soon_threadsafe(callback, error, result)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass


def lower_priority(nice: int) -> None:
    """Raise this thread's nice value by `nice` (threads it creates inherit it)."""
    if nice > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + nice)
        except (AttributeError, OSError):  # not Linux, or not permitted: keep the default priority
            pass


class EngineGate:
    """How many batches of one engine are in flight, shared by its shape queues."""

    def __init__(self, max_in_flight: int = 1):
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.waiters: list[asyncio.Event] = []

    @property
    def is_idle(self) -> bool:
        return self.in_flight < self.max_in_flight

    def release(self) -> None:
        self.in_flight -= 1
        for event in self.waiters:
            event.set()


@dataclass(eq=False)
class BatchObserver:
    """Hooks for metrics and logs; the default does nothing (tests, benchmarks)."""

    model_name: str = ""
    version: int = 0
    metrics: object | None = None
    counts: dict = field(default_factory=lambda: {"batches": 0, "rows": 0, "max_rows": 0})

    def on_batch(self, requests: Sequence[PendingRequest], started_s: float, compute_s: float, depth: int) -> None:
        rows = sum(request.rows for request in requests)
        self.counts["batches"] += 1
        self.counts["rows"] += rows
        self.counts["max_rows"] = max(self.counts["max_rows"], rows)
        if self.metrics is not None:
            self._record(requests, started_s, compute_s, rows, depth)
        if logger.isEnabledFor(logging.DEBUG):  # per batch: at 10k req/s, INFO would be ~20 GB a day
            logger.debug(orjson.dumps({
                "event": "batch", "model": self.model_name, "version": self.version, "rows": rows,
                "compute_ms": round(compute_s * 1000, 3), "request_ids": [r.request_id for r in requests],
            }).decode())

    def _record(self, requests, started_s, compute_s, rows, depth) -> None:
        self.metrics.batch_size.observe(rows)
        self.metrics.compute_time.observe(compute_s)
        self.metrics.queue_depth.set(depth)
        observe_many(self.metrics.queue_time, [started_s - request.enqueued_s for request in requests])


def model_failed(error: Exception) -> ServingError:
    """The default answer to a request whose run failed on its own: the model's failure."""
    return ModelFailed("model execution failed")


class Batcher:
    """The queue and loop of one (version, non-batch shape).

    `is_batchable` False: requests are never concatenated and their outputs are returned
    whole. `classify_error` turns the exception a request failed with, run alone, into
    its answer (the repository tells ONNX Runtime's refusals of an input from failures).
    """

    def __init__(
        self,
        run: RunFn,
        policy: BatchPolicy,
        executor: Executor | DispatchThreads,
        gate: EngineGate,
        latency: LatencyModel,
        *,
        clock: Callable[[], float] = time.monotonic,
        observer: BatchObserver | None = None,
        inline_max_s: float = 0.0,
        is_batchable: bool = True,
        output_names: Sequence[str] = (),
        classify_error: Callable[[Exception], ServingError] = model_failed,
    ):
        self.policy = policy
        self.is_batchable = is_batchable
        self._output_names, self._classify_error = tuple(output_names), classify_error
        self.latency = latency
        self._run, self._executor, self._gate, self._clock = run, executor, gate, clock
        self._threads = executor if isinstance(executor, DispatchThreads) else None
        self._event_loop = asyncio.get_running_loop()
        self._observer = observer or BatchObserver()
        self._inline_max_s = inline_max_s
        self._queue: deque[PendingRequest] = deque()
        self._queued_rows = 0
        self._in_flight = 0
        self._busy_since_s = 0.0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._last_arrival_s = -math.inf
        self._gap_ewma_s = math.inf
        self._is_arrival_while_busy = False  # during the batch running now
        self._was_arrival_while_busy = False  # during the last batch that finished
        self._backlog_rows_per_s = 0.0  # rows answered per second while requests kept waiting
        self._backlog_since_s: float | None = None  # the last completion that left requests waiting
        gate.waiters.append(self._wake)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Batches of this queue running now."""
        return self._in_flight

    @property
    def is_idle(self) -> bool:
        """Nothing queued and nothing running: the queue can be closed without loss."""
        return not self._queue and not self._in_flight

    @property
    def last_arrival_s(self) -> float:
        return self._last_arrival_s

    def submit(self, inputs: Outputs, rows: int, deadline_s: float, request_id: str = "") -> asyncio.Future:
        """Enqueue a request; refuse at once what the queue or the deadline cannot take."""
        now_s = self._clock()
        self._admit(rows, deadline_s, now_s)
        self._note_arrival(now_s)
        future = self._event_loop.create_future()
        self._queue.append(PendingRequest(inputs, rows, now_s, deadline_s, future, request_id))
        self._queued_rows += rows
        self._drained.clear()
        self._wake.set()
        return future

    def _admit(self, rows: int, deadline_s: float, now_s: float) -> None:
        refusal = self.refusal(rows, deadline_s, now_s)
        if refusal is not None:
            raise refusal

    def refusal(self, rows: int, deadline_s: float, now_s: float | None = None) -> ServingError | None:
        """Why a request of `rows` rows would be refused now, or None if it would be
        admitted. Cheap: the app asks before it reads a request's body."""
        now_s = self._clock() if now_s is None else now_s
        if self._task.done():
            return NotReady("this version is unloading")
        if rows > self.policy.max_batch_size:
            return BadRequest(f"batch of {rows} rows exceeds max_batch_size {self.policy.max_batch_size}")
        if len(self._queue) >= self.policy.max_queue_size:
            return QueueFull(f"queue full ({self.policy.max_queue_size} requests)")
        if not self.latency.is_known:
            return None
        delay_s = self.predicted_delay_s(rows, now_s)
        if delay_s >= deadline_s - now_s:  # the client's own deadline cannot be met (the policy would drop it)
            return DeadlineExceeded(f"cannot answer within the deadline (predicted {delay_s * 1000:.1f} ms)")
        target_s = self.policy.latency_target_s
        if target_s is not None and delay_s > target_s:  # our latency target: shed load, retry later
            return QueueFull(f"overloaded: predicted {delay_s * 1000:.1f} ms exceeds the {target_s * 1000:.1f} ms target")
        return None

    def predicted_delay_s(self, rows: int, now_s: float) -> float:
        """Time until a new request of `rows` rows would be answered: the compute the
        latency model predicts for what is ahead of it, or, when the queue has been
        backlogged, what is ahead of it at the rate the queue really drained (Little's
        law). The second counts what the model cannot see: under thousands of
        connections the event loop, not ONNX Runtime, sets the pace."""
        busy_remaining_s = 0.0
        if self._in_flight:
            busy_remaining_s = max(self.latency.predict_s(self.policy.max_batch_size) - (now_s - self._busy_since_s), 0.0)
        delay_s = admission_delay_s(self._queued_rows, rows, busy_remaining_s, self.policy, self.latency)
        if self._backlog_rows_per_s > 0.0 and self._queued_rows:
            delay_s = max(delay_s, (self._queued_rows + rows) / self._backlog_rows_per_s)
        return delay_s

    def _note_arrival(self, now_s: float) -> None:
        gap_s = now_s - self._last_arrival_s
        self._last_arrival_s = now_s
        self._gap_ewma_s = gap_s if self._gap_ewma_s == math.inf else 0.8 * self._gap_ewma_s + 0.2 * gap_s
        if self._in_flight:
            self._is_arrival_while_busy = True

    def expected_gap_s(self) -> float:
        """Expected time to the next arrival; inf when nothing arrived during the last batch
        (closed-loop or low load: the next request waits for our answer, so don't wait for it)."""
        return self._gap_ewma_s if self._was_arrival_while_busy else math.inf

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            decision = self._step()
            if decision is None or decision.send_count:
                continue
            await self._wait(decision.wait_s)

    def _step(self) -> Decision | None:
        """Decide and act once; None when the policy itself failed (its requests failed)."""
        try:
            decision = next_batch(self._queue, self._clock(), self._gate.is_idle, self.policy, self.latency, self.expected_gap_s())
            self._apply(decision)
            return decision
        except Exception:  # a bug here must not strand every queued request
            logger.exception("batcher loop failed; failing queued requests")
            self._fail_all(ModelFailed("batching failed"))
            return None

    def _next_after_completion(self) -> None:
        """Send the next batch from the completion callback itself. Waking the loop task
        instead costs a pass through the event loop's ready queue, which under thousands
        of connections is long: the engine then idled while requests waited (issue 9).
        The loop task still wakes (the gate's release set its event) and re-arms the
        policy's timer when nothing was sent."""
        if self._queue and self._gate.is_idle:
            self._step()

    def _apply(self, decision: Decision) -> None:
        if decision.dropped:
            self._drop(decision.dropped)
        if decision.send_count:
            self._dispatch([self._queue.popleft() for _ in range(decision.send_count)])
        self._note_drained()

    async def _wait(self, wait_s: float | None) -> None:
        if wait_s is None:
            await self._wake.wait()
            return
        timer = asyncio.get_running_loop().call_later(wait_s, self._wake.set)
        try:
            await self._wake.wait()
        finally:
            timer.cancel()

    def _drop(self, indices: tuple[int, ...]) -> None:
        doomed = set(indices)
        kept = deque()
        for index, request in enumerate(self._queue):
            if index in doomed:
                self._queued_rows -= request.rows
                _fail(request, DeadlineExceeded())
            else:
                kept.append(request)
        self._queue = kept

    def _dispatch(self, batch: list[PendingRequest]) -> None:
        rows = sum(request.rows for request in batch)
        self._queued_rows -= rows
        started_s = self._clock()
        if self._inline_max_s and self.latency.is_known and self.latency.predict_s(rows) <= self._inline_max_s:
            self._run_inline(batch, started_s)
            return
        self._gate.in_flight += 1
        self._in_flight += 1
        self._busy_since_s = started_s
        self._is_arrival_while_busy = False
        if self._threads is not None:
            self._threads.submit(self._event_loop, run_batch, (self._run, batch, self.is_batchable),
                                 partial(self._delivered, batch, started_s))
            return
        future = self._event_loop.run_in_executor(self._executor, run_batch, self._run, batch, self.is_batchable)
        future.add_done_callback(partial(self._complete, batch, started_s))

    def _run_inline(self, batch: list[PendingRequest], started_s: float) -> None:
        """A batch predicted to take less than a thread hand-off (futex wake + GIL transfer
        + loop wake-up) runs on the loop thread: handing it off would cost more than it saves."""
        self._finish(batch, started_s, None, run_batch(self._run, batch, self.is_batchable))

    def _delivered(self, batch: list[PendingRequest], started_s: float, error: BaseException | None, outcome) -> None:
        """A DispatchThreads job came back (on the loop thread)."""
        self._gate.release()
        self._in_flight -= 1
        self._was_arrival_while_busy = self._is_arrival_while_busy
        self._finish(batch, started_s, error, outcome)
        self._next_after_completion()

    def _complete(self, batch: list[PendingRequest], started_s: float, future: asyncio.Future) -> None:
        self._gate.release()
        self._in_flight -= 1
        self._was_arrival_while_busy = self._is_arrival_while_busy
        if future.cancelled():
            self._finish(batch, started_s, asyncio.CancelledError(), None)
        elif future.exception() is not None:
            self._finish(batch, started_s, future.exception(), None)
        else:
            self._finish(batch, started_s, None, future.result())
        self._next_after_completion()

    def _finish(self, batch, started_s: float, error: BaseException | None, outcome) -> None:
        try:
            self._settle(batch, started_s, error, outcome)
        except Exception:  # a bug here must not leave the batch's clients waiting forever
            logger.exception("settling a batch failed; failing its requests")
            for request in batch:
                _fail(request, ModelFailed("model execution failed"))
        self._note_drained()

    def _settle(self, batch, started_s: float, error: BaseException | None, outcome) -> None:
        if error is not None:  # the hand-off itself failed, not one request's run
            logger.error("batch of %d requests failed: %s", len(batch), error)
            for request in batch:
                _fail(request, ModelFailed("model execution failed"))
        elif outcome[1] is None:
            self._settle_split(batch, outcome[0])
        else:
            results, compute_s = outcome
            for request, outputs in zip(batch, results):
                if not request.future.done():
                    request.future.set_result(outputs)
            rows = sum(request.rows for request in batch)
            self.latency.observe(rows, compute_s)
            self._note_drain(rows)
            self._observer.on_batch(batch, started_s, compute_s, len(self._queue))

    def _settle_split(self, batch, results: list) -> None:
        """Answer each request of a batch that failed and was split: its outputs, or its own error."""
        failed = 0
        for request, result in zip(batch, results):
            if isinstance(result, Exception):
                failed += 1
                logger.warning("request %s failed: %s", request.request_id, result)
                _fail(request, self._request_error(result))
            elif not request.future.done():
                request.future.set_result(result)
        if len(batch) > 1:
            logger.warning("batch of %d requests failed; run again in parts, %d failed alone", len(batch), failed)

    def _request_error(self, error: Exception) -> ServingError:
        if isinstance(error, OutputRowsMismatch):
            index = error.output_index
            name = self._output_names[index] if index < len(self._output_names) else str(index)
            return ModelFailed(f"output '{name}' has shape {list(error.shape)}, not one row per input row "
                               f"({error.rows}): this version cannot answer this request")
        return self._classify_error(error)

    def _note_drain(self, rows: int) -> None:
        """Measure the drain rate only between completions that left requests waiting:
        then the rate is the pace of the whole path, not the pace of arrivals."""
        now_s = self._clock()
        if self._backlog_since_s is not None and now_s > self._backlog_since_s:
            rate = rows / (now_s - self._backlog_since_s)
            self._backlog_rows_per_s = rate if self._backlog_rows_per_s == 0.0 else 0.8 * self._backlog_rows_per_s + 0.2 * rate
        self._backlog_since_s = now_s if self._queue else None

    def _note_drained(self) -> None:
        if not self._queue and not self._in_flight:
            self._drained.set()

    def _fail_all(self, error: Exception) -> None:
        while self._queue:
            _fail(self._queue.popleft(), error)
        self._queued_rows = 0
        self._note_drained()

    async def drain(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or running; False if `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self._drained.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        """Stop the loop and fail whatever is still queued (after a drain, nothing)."""
        self._task.cancel()
        if self._wake in self._gate.waiters:
            self._gate.waiters.remove(self._wake)
        self._fail_all(NotReady("this version was unloaded"))


def _fail(request: PendingRequest, error: Exception) -> None:
    if not request.future.done():
        request.future.set_exception(error)
