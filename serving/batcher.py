"""Dynamic batching: one bounded FIFO queue per version and non-batch shape.

`Batcher` holds the queue and its loop. It asks the pure policy (`serving.batch_policy`)
what to drop, send and wait for, waits on an asyncio Event (with a timer, never a poll),
and hands each batch to the version's dispatch threads (`serving.dispatch`), where ONNX
Runtime runs without the GIL; `serving.batch_run` runs the batch there and sets its
answers when it comes back, and `serving.batch_observer` counts it. The next batch is
sent from that completion callback.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial

from serving.batch_observer import BatchObserver
from serving.batch_policy import Decision, LatencyModel, PendingRequest, QueuePace, next_batch, predicted_delay_s
from serving.batch_run import Outputs, RunFn, Summarise, answer, fail, fail_each, model_failed, request_error, run_batch
from serving.contract import BatchPolicy
from serving.dispatch import DispatchThreads, EngineGate
from serving.errors import BadRequest, DeadlineExceeded, ModelFailed, NotReady, QueueFull, ServingError
from serving.run_stop import RunStop

logger = logging.getLogger("serving.batcher")


def _summarise_unless_stopped(summarise: Summarise, stop: RunStop, outputs, rows, keep) -> None:
    """Summarise a batch's outputs only while its run still serves someone: a run stopped at
    its deadline was answered 504, and a single node checks no terminate flag, so such a run
    may still come back with outputs (a 1e9-element Range: 10 s late). Summarising them put
    answers no client got into the canary's figures and held the version's engine meanwhile
    (about 40 s and +4.8 GB for that output, every request to the version a 504)."""
    if not stop.stopped:
        summarise(outputs, rows, keep)


class RunDeadlines:
    """While a batch runs, each of its requests is answered 504 at its own deadline, and
    the run is stopped at the last one (``on_last``). One timer at a time, at the earliest
    deadline still ahead: a batch back in time costs one timer, as a single stop did;
    with only that stop, a request due at 0.2 s batched with one due at 1 s got its 504
    after 1 s."""

    __slots__ = ("_loop", "_clock", "_batch", "_on_last", "_last_s", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Callable[[], float], batch: list[PendingRequest],
                 on_last: Callable[[], None]):
        self._loop, self._clock, self._batch, self._on_last = loop, clock, batch, on_last
        self._last_s = max(request.deadline_s for request in batch)
        self._timer: asyncio.TimerHandle | None = None
        self._arm(min(request.deadline_s for request in batch))

    def _arm(self, at_s: float) -> None:
        self._timer = self._loop.call_later(max(at_s - self._clock(), 0.0), self._due)

    def _due(self) -> None:
        now_s = self._clock()
        if now_s >= self._last_s:
            self._timer = None
            self._on_last()
            return
        ahead = []
        for request in self._batch:
            if request.deadline_s <= now_s:
                fail(request, DeadlineExceeded("the model was still running at the request's deadline"))
            elif not request.future.done():
                ahead.append(request.deadline_s)
        self._arm(min(ahead, default=self._last_s))

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


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
        dispatch: DispatchThreads,
        gate: EngineGate,
        latency: LatencyModel,
        *,
        clock: Callable[[], float] = time.monotonic,
        observer: BatchObserver | None = None,
        is_batchable: bool = True,
        output_names: Sequence[str] = (),
        classify_error: Callable[[Exception], ServingError] = model_failed,
        summarise: Summarise | None = None,
    ):
        self.policy = policy
        self.is_batchable = is_batchable
        self.latency = latency
        self._run, self._dispatch_threads, self._gate, self._clock = run, dispatch, gate, clock
        self._summarise = summarise
        self._request_error = partial(request_error, output_names=tuple(output_names), classify_error=classify_error)
        self._event_loop = asyncio.get_running_loop()
        self._observer = observer or BatchObserver()
        self._queue: deque[PendingRequest] = deque()
        self._queued_rows = 0
        self._in_flight = 0
        self._pace = QueuePace()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        gate.waiters.append(self._engine_freed)
        gate.queues.append(self)
        self._task = self._event_loop.create_task(self._loop())

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
    def oldest_arrival_s(self) -> float:
        """When the request waiting longest here arrived (inf: none waits)."""
        return self._queue[0].enqueued_s if self._queue else math.inf

    @property
    def last_arrival_s(self) -> float:
        return self._pace.last_arrival_s

    def expected_gap_s(self) -> float:
        return self._pace.expected_gap_s()

    # ---- admission ----------------------------------------------------------------

    def submit(self, inputs: Outputs, rows: int, deadline_s: float, request_id: str = "",
               summarised: bool = True) -> asyncio.Future:
        """Enqueue a request; refuse at once what the queue or the deadline cannot take.
        ``summarised`` False keeps its outputs out of the version's output summary."""
        now_s = self._clock()
        refusal = self.refusal(rows, deadline_s, now_s)
        if refusal is not None:
            raise refusal
        self._pace.arrived(now_s, self._in_flight > 0)
        future = self._event_loop.create_future()
        self._queue.append(PendingRequest(inputs, rows, now_s, deadline_s, future, request_id, summarised))
        self._queued_rows += rows
        self._drained.clear()
        self._wake.set()
        return future

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
        delay_s = predicted_delay_s(rows, now_s, self._queued_rows, self._in_flight > 0, self._pace, self.policy,
                                    self.latency)
        if delay_s >= deadline_s - now_s:  # the client's own deadline cannot be met (the policy would drop it)
            left_s = deadline_s - now_s
            when = f"{left_s * 1000:.1f} ms from now" if left_s > 0 else "which has passed"
            return DeadlineExceeded(f"cannot answer within the deadline, {when} (predicted {delay_s * 1000:.1f} ms)")
        target_s = self.policy.latency_target_s
        if target_s is not None and delay_s > target_s:  # our latency target: shed load, retry later
            return QueueFull(f"overloaded: predicted {delay_s * 1000:.1f} ms exceeds the {target_s * 1000:.1f} ms target")
        return None

    # ---- the loop -----------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            if not self._queue:  # nothing to decide until a request arrives
                await self._wake.wait()
                continue
            decision = self._step()
            if decision is None or decision.send_count:
                continue
            await self._wait(decision.wait_s)

    def _step(self) -> Decision | None:
        """Decide and act once; None when the policy itself failed (its requests failed)."""
        try:
            decision = next_batch(self._queue, self._clock(), self._gate.is_idle, self.policy, self.latency,
                                  self._pace.expected_gap_s())
            self._apply(decision)
            return decision
        except Exception:  # a bug here must not strand every queued request
            logger.exception("batcher loop failed; failing queued requests")
            self._fail_all(ModelFailed("batching failed"))
            return None

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

    def _engine_freed(self) -> None:
        """The engine finished a batch (of this queue or another shape's): only a queue with
        requests waiting has anything to send. Waking an empty one cost a task switch and a
        policy pass per batch, which a lone request (concurrency 1) pays on every answer."""
        if self._queue:
            self._wake.set()

    def _drop(self, indices: tuple[int, ...]) -> None:
        doomed = set(indices)
        kept = deque()
        for index, request in enumerate(self._queue):
            if index in doomed:
                self._queued_rows -= request.rows
                fail(request, DeadlineExceeded())
            else:
                kept.append(request)
        self._queue = kept

    # ---- one batch out and back -----------------------------------------------------

    def _dispatch(self, batch: list[PendingRequest]) -> None:
        self._queued_rows -= sum(request.rows for request in batch)
        started_s = self._clock()
        self._gate.in_flight += 1
        self._in_flight += 1
        self._pace.batch_sent(started_s)
        stop = RunStop()  # serving/run_stop.py: no run outlives the last deadline it serves
        deadlines = RunDeadlines(self._event_loop, self._clock, batch, partial(self._stop_run, batch, stop))
        summarise = None if self._summarise is None else partial(_summarise_unless_stopped, self._summarise, stop)
        self._dispatch_threads.submit(self._event_loop, run_batch, (stop.running(self._run), batch, self.is_batchable, summarise),
                                      partial(self._delivered, batch, started_s, stop, deadlines))

    def _stop_run(self, batch: list[PendingRequest], stop: RunStop) -> None:
        stop.stop()
        fail_each(batch, DeadlineExceeded("the model was still running at the request's deadline; its run was stopped"))

    def _delivered(self, batch: list[PendingRequest], started_s: float, stop: RunStop, deadlines: RunDeadlines,
                   error: BaseException | None, outcome) -> None:
        """The batch came back from its dispatch thread (on the loop thread)."""
        deadlines.cancel()
        self._gate.release()
        self._in_flight -= 1
        self._pace.batch_returned()
        if stop.stopped:  # answered 504 when stopped; its time teaches the latency model nothing
            self._note_drained()
        else:
            self._finish(batch, started_s, error, outcome)
        self._next_after_completion()

    def _finish(self, batch, started_s: float, error: BaseException | None, outcome) -> None:
        try:
            compute_s = answer(batch, error, outcome, self._request_error)
            if compute_s is not None:
                self._learn(batch, started_s, compute_s)
        except Exception:  # a bug here must not leave the batch's clients waiting forever
            logger.exception("settling a batch failed; failing its requests")
            fail_each(batch, ModelFailed("model execution failed"))
        self._note_drained()

    def _learn(self, batch, started_s: float, compute_s: float) -> None:
        """A batch that ran whole teaches the latency model and the drain rate."""
        rows = sum(request.rows for request in batch)
        self.latency.observe(rows, compute_s)
        self._pace.drained(rows, self._clock(), bool(self._queue))
        self._observer.on_batch(batch, started_s, compute_s, len(self._queue))

    def _next_after_completion(self) -> None:
        """Send the next batch from the completion callback itself. Waking the loop task
        instead costs a pass through the event loop's ready queue, which under thousands
        of connections is long: the engine then idled while requests waited (issue 9).
        The next batch is that of the shape queue whose first request has waited longest,
        this one's or another's: always this one's starved other shapes, whose woken tasks
        found the engine taken every time, until their requests' deadlines passed.
        Each queue's loop task still wakes (the gate's release set its event) and re-arms
        the policy's timer when nothing was sent."""
        if not self._gate.is_idle:
            return
        oldest = min(self._gate.queues, key=lambda queue: queue.oldest_arrival_s)
        if oldest._queue:
            oldest._step()

    # ---- draining and closing -------------------------------------------------------

    def _note_drained(self) -> None:
        if not self._queue and not self._in_flight:
            self._drained.set()

    def _fail_all(self, error: Exception) -> None:
        while self._queue:
            fail(self._queue.popleft(), error)
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
        if self._engine_freed in self._gate.waiters:
            self._gate.waiters.remove(self._engine_freed)
        if self in self._gate.queues:
            self._gate.queues.remove(self)
        self._fail_all(NotReady("this version was unloaded"))
