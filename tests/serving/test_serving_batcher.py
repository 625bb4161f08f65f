"""The batcher loop on a real event loop, with a fake model (a function of the inputs).

No fixed sleeps: a test that needs the engine busy holds the fake model (each run waits
for a permit) and awaits the event the model sets when a run starts. A fake clock drives
the policy where a test needs exact times (admission, the arrival-gap estimate)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from dataclasses import replace

import numpy as np
import orjson
import pytest
from prometheus_client import REGISTRY

from serving import metrics
from serving.batch_observer import BatchObserver
from serving.batch_policy import LatencyModel, PendingRequest
from serving.batch_run import run_batch
from serving.batcher import Batcher
from serving.contract import BatchPolicy
from serving.dispatch import DispatchThreads, EngineGate, lower_priority
from serving.errors import BadRequest, DeadlineExceeded, ModelFailed, NotReady, QueueFull

POISON = -1.0  # a row holding this value makes the fake model fail


class FakeModel:
    """Doubles its input; records each run's rows; fails on a POISON row or with `error`.

    Closed (`is_open=False`), each run waits for a permit from `allow()`; `open()` lets
    every run through. `started` counts runs begun, for `wait_for_run`."""

    def __init__(self, delay_s: float = 0.0, error: BaseException | None = None, is_open: bool = True):
        self.delay_s, self.error = delay_s, error
        self.batch_rows: list[int] = []
        self.threads: list[str] = []
        self.started = threading.Semaphore(0)
        self._permits = threading.Semaphore(0)
        self._open = threading.Event()
        if is_open:
            self._open.set()

    def allow(self, runs: int = 1) -> None:
        for _ in range(runs):
            self._permits.release()

    def open(self) -> None:
        self._open.set()
        self.allow(64)

    def __call__(self, feeds):
        self.batch_rows.append(feeds[0].shape[0])
        self.threads.append(threading.current_thread().name)
        self.started.release()
        if not self._open.is_set():
            assert self._permits.acquire(timeout=5)
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        if (feeds[0] == POISON).any():
            raise RuntimeError("poisoned row")
        return [feeds[0] * 2]


class FakeClock:
    def __init__(self, now_s: float = 100.0):
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


class FixedLatency(LatencyModel):
    """A latency model that has learned `per_row_s` and keeps it (runs do not move it)."""

    def __init__(self, per_row_s: float):
        super().__init__()
        super().observe(1, per_row_s)

    def observe(self, rows: int, seconds: float) -> None:
        pass


async def wait_for_run(model: FakeModel) -> None:
    """Until the model has begun one more run (bounded)."""
    assert await asyncio.to_thread(model.started.acquire, True, 5)


@pytest.fixture(autouse=True)
async def watchdog():
    """Every test here ends within 5 s: a future nobody resolves fails the test, not the run."""
    loop = asyncio.get_running_loop()
    timer = loop.call_later(5.0, lambda: [task.cancel() for task in asyncio.all_tasks(loop)])
    yield
    timer.cancel()


@pytest.fixture
def dispatch():
    threads = DispatchThreads("onnx-test", threads=1)
    yield threads
    threads.close()


def make_batcher(model, dispatch, latency=None, gate=None, **options) -> Batcher:
    policy = {"max_batch_size": 8, "max_queue_delay_s": 0.002, "max_queue_size": 64}
    policy.update({key: options.pop(key) for key in list(options) if key in BatchPolicy.__dataclass_fields__})
    return Batcher(model, BatchPolicy(**policy), dispatch, gate or EngineGate(1), latency or LatencyModel(), **options)


def row(value: float, width: int = 4) -> tuple[np.ndarray]:
    return (np.full((1, width), value, dtype=np.float32),)


def deadline(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def first_values(results) -> list:
    return [type(result) if isinstance(result, Exception) else float(result[0][0, 0]) for result in results]


async def assert_settled(batcher: Batcher, gate: EngineGate | None = None) -> None:
    """Nothing queued, nothing in flight, and drain() answers at once: well before its
    timeout, which is long enough that a loaded machine's pause does not read as a wait."""
    started_s = time.monotonic()
    assert await batcher.drain(timeout_s=4.0) is True
    assert time.monotonic() - started_s < 2.0
    assert (batcher.depth, batcher.in_flight, batcher.is_idle) == (0, 0, True)
    if gate is not None:
        assert (gate.in_flight, gate.is_idle) == (0, True)


async def assert_no_rows_counted(batcher: Batcher) -> None:
    """With a learned 1 ms per row and nothing queued or running, admission predicts exactly
    one 1-row batch: a deadline 1.5 ms away is met, one 0.9 ms away is refused. Rows still
    counted as queued (or counted below zero) would move that line."""
    now_s = time.monotonic()  # one instant for both: the line is judged, not how fast this machine runs the batch
    assert isinstance(batcher.refusal(1, now_s + 0.0009, now_s), DeadlineExceeded)
    assert batcher.refusal(1, now_s + 0.0015, now_s) is None
    assert float((await batcher.submit(row(1), 1, deadline()))[0][0, 0]) == 2.0


# ---- batching and splitting ------------------------------------------------------------


async def test_outputs_are_split_back_to_their_requests(dispatch):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch)
    first = batcher.submit(row(0), 1, deadline())
    await wait_for_run(model)  # the engine is busy: the rest queue into one batch
    futures = [batcher.submit(row(value), 1, deadline()) for value in (1, 2, 3)]
    model.open()

    results = await asyncio.gather(first, *futures)

    assert first_values(results) == [0.0, 2.0, 4.0, 6.0]
    assert model.batch_rows == [1, 3]


async def test_multi_row_requests_get_back_exactly_their_rows(dispatch):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch)
    first = batcher.submit(row(9), 1, deadline())
    await wait_for_run(model)
    two = batcher.submit((np.array([[1.0], [2.0]], np.float32),), 2, deadline())
    three = batcher.submit((np.array([[3.0], [4.0], [5.0]], np.float32),), 3, deadline())
    model.open()

    await first
    assert (await two)[0].tolist() == [[2.0], [4.0]]
    assert (await three)[0].tolist() == [[6.0], [8.0], [10.0]]
    assert model.batch_rows == [1, 5]


async def test_lone_request_is_not_delayed_by_the_queue_window(dispatch):
    batcher = make_batcher(FakeModel(), dispatch, max_queue_delay_s=10.0)  # past the 5 s watchdog
    started_s = time.monotonic()

    await batcher.submit(row(1), 1, deadline())

    assert time.monotonic() - started_s < 2.0  # a fifth of the window, as before (0.2 s of 1 s), with room for a loaded box's pause


async def test_concurrent_requests_share_batches(dispatch):
    model = FakeModel(delay_s=0.005)
    batcher = make_batcher(model, dispatch, max_batch_size=16)

    await asyncio.gather(*(batcher.submit(row(i), 1, deadline()) for i in range(64)))

    assert max(model.batch_rows) > 1
    assert sum(model.batch_rows) == 64
    assert max(model.batch_rows) <= 16


async def test_failed_batch_fails_every_request_in_it_each_on_its_own(dispatch):
    model = FakeModel(error=RuntimeError("boom"), is_open=False)
    batcher = make_batcher(model, dispatch)
    first = batcher.submit(row(0), 1, deadline())
    await wait_for_run(model)
    rest = [batcher.submit(row(value), 1, deadline()) for value in (1, 2)]
    model.open()

    results = await asyncio.gather(first, *rest, return_exceptions=True)

    assert [type(result) for result in results] == [ModelFailed, ModelFailed, ModelFailed]
    assert [result.message for result in results] == ["model execution failed"] * 3
    assert model.batch_rows == [1, 2, 1, 1]
    await assert_settled(batcher)


async def test_one_poisoned_request_fails_alone_and_its_batch_mates_are_answered(dispatch):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch)
    first = batcher.submit(row(7), 1, deadline())
    await wait_for_run(model)
    rest = [batcher.submit(row(value), 1, deadline()) for value in (1, 2, POISON, 3, 4)]
    model.open()

    results = await asyncio.gather(first, *rest, return_exceptions=True)

    assert first_values(results) == [14.0, 2.0, 4.0, ModelFailed, 6.0, 8.0]
    assert model.batch_rows == [1, 5, 2, 3, 1, 2]
    await assert_settled(batcher)


async def test_failed_run_does_not_teach_the_latency_model(dispatch):
    latency = LatencyModel()
    batcher = make_batcher(FakeModel(), dispatch, latency=latency)

    with pytest.raises(ModelFailed):
        await batcher.submit(row(POISON), 1, deadline())
    assert latency.is_known is False  # a failed run's time says nothing about the model's speed
    await batcher.submit(row(1), 1, deadline())
    assert latency.is_known is True


async def test_lone_failure_is_classified_by_the_repository_hook(dispatch):
    batcher = make_batcher(FakeModel(), dispatch, classify_error=lambda error: BadRequest(f"refused: {error}"))

    with pytest.raises(BadRequest, match="^refused: poisoned row$"):
        await batcher.submit(row(POISON), 1, deadline())
    await assert_settled(batcher)


async def test_output_without_one_row_per_input_row_fails_naming_the_output(dispatch):
    def sums(feeds):
        return [feeds[0].sum(axis=0, keepdims=True), feeds[0]]

    named = make_batcher(sums, dispatch, output_names=["total", "echo"])
    unnamed = make_batcher(sums, dispatch)
    two_rows = (np.ones((2, 3), np.float32),)

    with pytest.raises(ModelFailed) as failure:
        await named.submit(two_rows, 2, deadline())
    with pytest.raises(ModelFailed) as unnamed_failure:
        await unnamed.submit(two_rows, 2, deadline())

    assert failure.value.message == ("output 'total' has shape [1, 3], not one row per input row (2): "
                                     "this version cannot answer this request")
    assert unnamed_failure.value.message.startswith("output '0' has shape [1, 3]")
    assert (await named.submit(row(2, width=3), 1, deadline()))[0].tolist() == [[2.0, 2.0, 2.0]]


async def test_scalar_output_is_not_one_row_per_input_row(dispatch):
    batcher = make_batcher(lambda feeds: [np.float32(feeds[0].sum()) * np.ones(())], dispatch, output_names=["sum"])

    with pytest.raises(ModelFailed, match=r"^output 'sum' has shape \[\], not one row per input row \(1\): "
                                          r"this version cannot answer this request$"):
        await batcher.submit(row(1), 1, deadline())


async def test_non_batchable_batcher_never_concatenates_and_returns_outputs_whole(dispatch):
    model = FakeModel(is_open=False)
    sums = []

    def total(feeds):
        sums.append(feeds[0].shape[0])
        model(feeds)
        return [feeds[0].sum(axis=0)]  # no batch axis at all

    batcher = make_batcher(total, dispatch, is_batchable=False)  # even with a policy that would batch
    first = batcher.submit(row(1), 1, deadline())
    await wait_for_run(model)
    rest = [batcher.submit((np.full((3, 2), value, np.float32),), 1, deadline()) for value in (1.0, 2.0)]
    model.open()

    results = await asyncio.gather(first, *rest)

    assert [result[0].tolist() for result in results] == [[1.0] * 4, [3.0, 3.0], [6.0, 6.0]]
    assert sums == [1, 3, 3]


def test_run_batch_reports_the_compute_time_of_a_clean_batch():
    requests = [PendingRequest(row(value), 1, 0.0, 1.0, None) for value in (1, 2)]

    results, compute_s = run_batch(lambda feeds: [feeds[0] + 1], requests)

    assert [result[0].tolist() for result in results] == [[[2.0] * 4], [[3.0] * 4]]
    assert 0.0 <= compute_s < 0.5


# ---- admission ---------------------------------------------------------------------------


async def test_full_queue_refuses_at_once(dispatch):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch, max_queue_size=2)
    running = batcher.submit(row(0), 1, deadline())
    await wait_for_run(model)  # first one is now running; two more fill the queue
    queued = [batcher.submit(row(1), 1, deadline()), batcher.submit(row(2), 1, deadline())]

    with pytest.raises(QueueFull, match=r"^queue full \(2 requests\)$"):
        batcher.submit(row(3), 1, deadline())
    assert batcher.depth == 2
    model.open()
    await asyncio.gather(running, *queued)
    await assert_settled(batcher)


async def test_request_with_more_rows_than_max_batch_size_is_refused(dispatch):
    batcher = make_batcher(FakeModel(), dispatch, max_batch_size=4)

    with pytest.raises(BadRequest, match="^batch of 5 rows exceeds max_batch_size 4$"):
        batcher.submit((np.zeros((5, 4), np.float32),), 5, deadline())
    assert (await batcher.submit((np.ones((4, 1), np.float32),), 4, deadline()))[0].shape == (4, 1)


async def test_overload_is_refused_at_once_when_the_latency_target_cannot_be_met(dispatch):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch, latency=FixedLatency(0.1), latency_target_s=0.45)
    accepted = [batcher.submit(row(i), 1, deadline()) for i in range(4)]  # 5 rows would take 500 ms

    with pytest.raises(QueueFull, match=r"^overloaded: predicted 500\.0 ms exceeds the 450\.0 ms target$"):
        batcher.submit(row(9), 1, deadline())
    model.open()
    await asyncio.gather(*accepted)


async def test_request_predicted_to_finish_exactly_at_the_latency_target_is_admitted(dispatch):
    clock = FakeClock(0.0)
    batcher = make_batcher(FakeModel(), dispatch, latency=FixedLatency(0.1), latency_target_s=0.1, clock=clock)

    assert float((await batcher.submit(row(1), 1, 60.0))[0][0, 0]) == 2.0


async def test_request_whose_deadline_cannot_be_met_is_refused_at_admission(dispatch):
    clock = FakeClock()
    batcher = make_batcher(FakeModel(), dispatch, latency=FixedLatency(0.1), clock=clock)

    with pytest.raises(DeadlineExceeded, match=r"^cannot answer within the deadline, 99\.0 ms from now \(predicted 100\.0 ms\)$"):
        batcher.submit(row(1), 1, clock.now_s + 0.099)
    assert batcher.depth == 0
    assert float((await batcher.submit(row(1), 1, clock.now_s + 0.101))[0][0, 0]) == 2.0


async def test_a_deadline_already_past_is_said_to_have_passed(dispatch):
    clock = FakeClock()
    batcher = make_batcher(FakeModel(), dispatch, latency=FixedLatency(0.1), clock=clock)

    with pytest.raises(DeadlineExceeded, match=r"^cannot answer within the deadline, which has passed \(predicted 100\.0 ms\)$"):
        batcher.submit(row(1), 1, clock.now_s - 0.0001)


async def test_request_that_would_finish_exactly_at_its_deadline_is_refused_at_once(dispatch):
    clock = FakeClock(0.0)  # 0.1 - 0.0 is exact: the boundary itself is tested
    batcher = make_batcher(FakeModel(), dispatch, latency=FixedLatency(0.1), clock=clock)

    with pytest.raises(DeadlineExceeded):  # at admission, as the policy would drop it from the queue
        batcher.submit(row(1), 1, 0.1)
    assert batcher.depth == 0


async def test_admission_counts_what_is_left_of_the_running_batch(dispatch):
    clock = FakeClock()
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch, latency=FixedLatency(0.1), clock=clock)
    running = batcher.submit(row(1), 1, clock.now_s + 5)
    await wait_for_run(model)
    clock.now_s += 0.5  # a full batch takes 800 ms: 300 ms of it left, then 100 ms for one row

    with pytest.raises(DeadlineExceeded, match=r"^cannot answer within the deadline, 399\.0 ms from now \(predicted 400\.0 ms\)$"):
        batcher.submit(row(2), 1, clock.now_s + 0.399)
    queued = batcher.submit(row(2), 1, clock.now_s + 0.401)
    model.open()

    assert first_values(await asyncio.gather(running, queued)) == [2.0, 4.0]


async def test_admission_predicts_from_the_pace_the_queue_really_drained_at(dispatch):
    clock = FakeClock(100.0)
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch, latency=FixedLatency(0.001), clock=clock, max_batch_size=1)
    first, second, third, fourth = [batcher.submit(row(i), 1, clock.now_s + 60) for i in range(4)]
    for moment_s, done in ((100.1, first), (100.2, second)):  # one row per 100 ms, though the model predicts 1 ms
        clock.now_s = moment_s
        model.allow()
        await done

    # One request waits, one runs: at 10 rows/s a new one is answered in about 200 ms.
    with pytest.raises(DeadlineExceeded, match=r"^cannot answer within the deadline, 150\.0 ms from now \(predicted 200\.0 ms\)$"):
        batcher.submit(row(9), 1, clock.now_s + 0.15)
    admitted = batcher.submit(row(9), 1, clock.now_s + 0.25)
    model.open()
    assert first_values(await asyncio.gather(third, fourth, admitted)) == [4.0, 6.0, 18.0]


async def test_latency_target_is_not_checked_before_anything_is_learned(dispatch):
    batcher = make_batcher(FakeModel(), dispatch, latency_target_s=0.000001)

    assert float((await batcher.submit(row(3), 1, deadline()))[0][0, 0]) == 6.0


# ---- deadlines ---------------------------------------------------------------------------


async def test_request_past_its_deadline_gets_504_at_its_deadline_and_is_not_computed(dispatch):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch, max_queue_delay_s=10.0)
    running = batcher.submit(row(0), 1, deadline())
    await wait_for_run(model)
    submitted_s = time.monotonic()
    late = batcher.submit(row(1), 1, submitted_s + 0.3)

    with pytest.raises(DeadlineExceeded, match="^deadline exceeded before the request was computed$"):
        await late
    waited_s = time.monotonic() - submitted_s
    model.open()
    await running

    assert 0.29 <= waited_s < 1.8  # at its deadline, not when the engine frees (5 s) nor the window (10 s); 1.5 s for a loaded box
    assert model.batch_rows == [1]
    await assert_settled(batcher)


async def test_expired_request_leaves_its_queue_mates_to_be_answered(dispatch):
    model = FakeModel(is_open=False)
    gate = EngineGate(1)
    batcher = make_batcher(model, dispatch, gate=gate)
    running = batcher.submit(row(0), 1, deadline())
    await wait_for_run(model)
    short = batcher.submit(row(1), 1, time.monotonic() + 0.05)
    long = batcher.submit(row(2), 1, deadline())

    with pytest.raises(DeadlineExceeded):
        await short
    model.open()

    assert first_values(await asyncio.gather(running, long)) == [0.0, 4.0]
    assert model.batch_rows == [1, 1]
    await assert_settled(batcher, gate)


# ---- accounting --------------------------------------------------------------------------


async def test_accounting_returns_to_zero_after_successes_errors_and_timeouts(dispatch):
    model = FakeModel(is_open=False)
    gate = EngineGate(1)
    batcher = make_batcher(model, dispatch, latency=FixedLatency(0.001), gate=gate)
    futures = [batcher.submit(row(0), 1, deadline())]
    await wait_for_run(model)
    futures += [batcher.submit(row(value), 1, deadline()) for value in (1, POISON, 2)]
    futures.append(batcher.submit((np.ones((3, 4), np.float32),), 3, time.monotonic() + 0.05))  # times out
    futures += [batcher.submit(row(value), 1, deadline()) for value in (3, 4, 5, 6)]

    with pytest.raises(DeadlineExceeded):
        await futures[4]
    model.open()
    results = await asyncio.gather(*futures, return_exceptions=True)

    assert first_values(results) == [0.0, 2.0, ModelFailed, 4.0, DeadlineExceeded, 6.0, 8.0, 10.0, 12.0]
    await assert_settled(batcher, gate)
    await assert_no_rows_counted(batcher)


class HandOffBroke(BaseException):
    """Not an Exception: run_batch lets it through, as it would a thread being torn down."""


async def test_hand_off_failure_fails_the_batch_and_accounting_returns_to_zero(dispatch, caplog):
    gate = EngineGate(1)
    model = FakeModel(error=HandOffBroke("torn down"))
    batcher = make_batcher(model, dispatch, gate=gate)

    with caplog.at_level(logging.WARNING, logger="serving.batcher"):
        with pytest.raises(ModelFailed, match="^model execution failed$"):
            await batcher.submit(row(1), 1, deadline())

    assert [(record.levelname, record.getMessage()) for record in caplog.records] == [
        ("ERROR", "batch of 1 requests failed: torn down")]
    await assert_settled(batcher, gate)
    model.error = None
    assert float((await batcher.submit(row(1), 1, deadline()))[0][0, 0]) == 2.0


async def test_drain_waits_for_queued_and_running_batches(dispatch):
    batcher = make_batcher(FakeModel(delay_s=0.02), dispatch)
    futures = [batcher.submit(row(i), 1, deadline()) for i in range(3)]

    assert await batcher.drain(timeout_s=2.0) is True
    assert all(future.done() for future in futures)


async def test_drain_gives_up_after_its_timeout(dispatch):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch)
    running = batcher.submit(row(1), 1, deadline())
    await wait_for_run(model)
    started_s = time.monotonic()

    assert await batcher.drain(timeout_s=0.2) is False
    assert time.monotonic() - started_s < 2.0  # ten times the timeout, as 0.5 s of 0.05 s was, with room for a loaded box's pause
    assert (batcher.in_flight, batcher.is_idle) == (1, False)
    model.open()
    await running
    await assert_settled(batcher)


async def test_close_fails_what_is_queued_and_refuses_new_requests(dispatch):
    model = FakeModel(is_open=False)
    gate = EngineGate(1)
    batcher = make_batcher(model, dispatch, gate=gate)
    running = batcher.submit(row(1), 1, deadline())
    await wait_for_run(model)
    queued = batcher.submit(row(2), 1, deadline())

    batcher.close()
    await asyncio.sleep(0)  # one loop turn: the cancelled loop task ends

    with pytest.raises(NotReady, match="^this version was unloaded$"):
        await queued
    with pytest.raises(NotReady, match="^this version is unloading$"):
        batcher.submit(row(3), 1, deadline())
    assert gate.waiters == []
    assert batcher.depth == 0
    model.open()
    assert float((await running)[0][0, 0]) == 2.0


async def test_a_failing_policy_fails_the_queued_requests_and_the_loop_goes_on(dispatch, caplog):
    class BreaksOnce(FixedLatency):
        is_broken = False

        def predict_s(self, rows: int) -> float:
            if self.is_broken:
                self.is_broken = False
                raise ArithmeticError("bug")
            return super().predict_s(rows)

    latency = BreaksOnce(0.001)
    batcher = make_batcher(FakeModel(), dispatch, latency=latency)
    queued = [batcher.submit(row(1), 1, deadline()), batcher.submit(row(2), 1, deadline())]
    latency.is_broken = True  # admission is done: the loop's next decision raises

    with caplog.at_level(logging.ERROR, logger="serving.batcher"):
        results = await asyncio.gather(*queued, return_exceptions=True)

    assert [(type(result), result.message) for result in results] == [(ModelFailed, "batching failed")] * 2
    assert [record.getMessage() for record in caplog.records] == ["batcher loop failed; failing queued requests"]
    assert float((await batcher.submit(row(2), 1, deadline()))[0][0, 0]) == 4.0
    await assert_settled(batcher)
    await assert_no_rows_counted(batcher)


# ---- the arrival-gap estimate -------------------------------------------------------------


async def test_expected_gap_is_learned_from_arrivals_during_a_batch(dispatch):
    clock = FakeClock(10.0)
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch, clock=clock)
    assert batcher.expected_gap_s() == math.inf
    first = batcher.submit(row(1), 1, clock.now_s + 60)
    await wait_for_run(model)
    clock.now_s = 12.0
    second = batcher.submit(row(2), 1, clock.now_s + 60)
    assert batcher.expected_gap_s() == math.inf  # no batch has finished yet: nothing learned
    clock.now_s = 12.5
    third = batcher.submit(row(3), 1, clock.now_s + 60)
    model.allow()  # the first batch ends: two requests arrived while it ran

    await first
    assert batcher.expected_gap_s() == pytest.approx(0.8 * 2.0 + 0.2 * 0.5)
    model.allow()  # the second batch (both queued requests): nothing arrived meanwhile
    assert first_values(await asyncio.gather(second, third)) == [4.0, 6.0]
    assert batcher.expected_gap_s() == math.inf
    assert model.batch_rows == [1, 2]


async def test_after_a_busy_spell_a_request_waits_its_window_for_company(dispatch):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch, max_queue_delay_s=0.3)
    first = batcher.submit(row(1), 1, deadline())
    await wait_for_run(model)
    waiting = batcher.submit(row(2), 1, deadline())  # arrives while the engine is busy: more may come
    model.open()
    await first

    company = batcher.submit(row(3), 1, deadline())

    assert first_values(await asyncio.gather(waiting, company)) == [4.0, 6.0]
    assert model.batch_rows == [1, 2]


# ---- where batches run ---------------------------------------------------------------------


async def test_even_a_batch_predicted_quicker_than_a_hand_off_runs_on_a_dispatch_thread(dispatch):
    model = FakeModel()
    batcher = make_batcher(model, dispatch, latency=FixedLatency(0.000001))

    result = await batcher.submit(row(2), 1, deadline())

    assert float(result[0][0, 0]) == 4.0
    assert model.threads == ["onnx-test-0"]
    await assert_settled(batcher)


async def test_dedicated_dispatch_thread_runs_batches_off_the_loop_and_splits_results(dispatch):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch)
    first = batcher.submit(row(0), 1, deadline())
    await wait_for_run(model)
    rest = [batcher.submit(row(value), 1, deadline()) for value in (1, 2)]
    model.open()

    results = await asyncio.gather(first, *rest)

    assert first_values(results) == [0.0, 2.0, 4.0]
    assert model.batch_rows == [1, 2]
    assert set(model.threads) == {"onnx-test-0"}


async def test_failure_on_the_dispatch_thread_fails_that_batch_only(dispatch):
    batcher = make_batcher(FakeModel(), dispatch)

    with pytest.raises(ModelFailed):
        await batcher.submit(row(POISON), 1, deadline())
    assert float((await batcher.submit(row(1), 1, deadline()))[0][0, 0]) == 2.0


def test_closing_dispatch_threads_ends_them_after_the_queued_jobs():
    threads = DispatchThreads("onnx-close", threads=2)
    done = []
    loop = asyncio.new_event_loop()
    try:
        for index in range(4):
            threads.submit(loop, done.append, (index,), lambda error, result: None)

        threads.close()

        for thread in threads._threads:
            thread.join(timeout=2)
        assert not any(thread.is_alive() for thread in threads._threads)
        assert sorted(done) == [0, 1, 2, 3]
    finally:
        loop.close()


def test_dispatch_threads_run_at_the_lowered_priority():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    threads = DispatchThreads("onnx-nice", threads=1, nice=1)
    seen = []
    loop = asyncio.new_event_loop()
    try:
        threads.submit(loop, lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())), (),
                       lambda error, result: None)
        threads.close()
        threads._threads[0].join(timeout=2)
    finally:
        loop.close()

    assert seen == [min(base + 1, 19)]


def test_dispatch_threads_are_daemons_so_a_stuck_run_cannot_block_exit():
    threads = DispatchThreads("onnx-daemon", threads=2)
    try:
        mine = [thread for thread in threading.enumerate() if thread.name.startswith("onnx-daemon-")]
        assert sorted(thread.name for thread in mine) == ["onnx-daemon-0", "onnx-daemon-1"]
        assert all(thread.daemon for thread in mine)
    finally:
        threads.close()


def test_lower_priority_by_zero_changes_nothing():
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    lower_priority(0)

    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


# ---- what a batch reports ------------------------------------------------------------------


def sample(name: str, labels: dict) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_each_batch_is_counted_in_the_observer_and_the_metrics(dispatch, caplog):
    version_metrics = metrics.VersionMetrics("observed", 3)
    labels = {"model": "observed", "version": "3"}
    observer = BatchObserver("observed", 3, version_metrics)
    model = FakeModel(delay_s=0.005, is_open=False)
    batcher = make_batcher(model, dispatch, observer=observer)
    try:
        with caplog.at_level(logging.DEBUG, logger="serving.batcher"):
            first = batcher.submit(row(1), 1, deadline(), "req-a")
            await wait_for_run(model)
            rest = [batcher.submit((np.ones((2, 4), np.float32),), 2, deadline(), "req-b"),
                    batcher.submit(row(3), 1, deadline(), "req-c")]
            model.open()
            await asyncio.gather(first, *rest)

        assert observer.counts == {"batches": 2, "rows": 4, "max_rows": 3}
        assert sample("modelops_batch_size_count", labels) == 2
        assert sample("modelops_batch_size_sum", labels) == 4
        assert sample("modelops_compute_duration_seconds_count", labels) == 2
        assert sample("modelops_queue_duration_seconds_bucket", {**labels, "le": "+Inf"}) == 3
        assert 0.0 <= sample("modelops_queue_duration_seconds_sum", labels) < 5.0
        assert sample("modelops_queue_depth", labels) == 0
        events = [orjson.loads(record.getMessage()) for record in caplog.records if record.name == "serving.batcher"]
        assert [(event["event"], event["model"], event["version"], event["rows"], event["request_ids"])
                for event in events] == [("batch", "observed", 3, 1, ["req-a"]), ("batch", "observed", 3, 3, ["req-b", "req-c"])]
        compute_ms = [event["compute_ms"] for event in events]
        assert all(5.0 <= ms < 1000.0 and round(ms, 3) == ms for ms in compute_ms)  # milliseconds, to the µs
        assert sum(compute_ms) / 1000 == pytest.approx(sample("modelops_compute_duration_seconds_sum", labels), abs=2e-6)
    finally:
        version_metrics.remove()


async def test_requests_queued_before_the_loop_runs_are_one_run_counted_once(dispatch):
    version_metrics = metrics.VersionMetrics("together", 1)
    labels = {"model": "together", "version": "1"}
    model = FakeModel()
    batcher = make_batcher(model, dispatch, latency=FixedLatency(0.0001),
                           observer=BatchObserver("together", 1, version_metrics))
    try:
        both = [batcher.submit(row(1), 1, deadline()), batcher.submit(row(2), 1, deadline())]  # before the loop runs

        assert first_values(await asyncio.gather(*both)) == [2.0, 4.0]
        assert model.batch_rows == [2]
        assert model.threads == ["onnx-test-0"]
        assert sample("modelops_batch_size_sum", labels) == 2
        assert sample("modelops_queue_duration_seconds_bucket", {**labels, "le": "+Inf"}) == 2
        assert 0.0 <= sample("modelops_queue_duration_seconds_sum", labels) < 5.0
    finally:
        version_metrics.remove()


async def test_split_batch_logs_each_failed_request_and_one_summary(dispatch, caplog):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch)
    first = batcher.submit(row(1), 1, deadline(), "first")
    await wait_for_run(model)
    rest = [batcher.submit(row(value), 1, deadline(), f"r{index}")
            for index, value in enumerate((POISON, POISON))]

    with caplog.at_level(logging.WARNING, logger="serving.batcher"):
        model.open()
        await asyncio.gather(first, *rest, return_exceptions=True)

    assert [record.getMessage() for record in caplog.records] == [
        "request r0 failed: poisoned row",
        "request r1 failed: poisoned row",
        "batch of 2 requests failed; run again in parts, 2 failed alone",
    ]


async def test_lone_failure_logs_the_request_and_no_batch_summary(dispatch, caplog):
    batcher = make_batcher(FakeModel(), dispatch)

    with caplog.at_level(logging.WARNING, logger="serving.batcher"):
        with pytest.raises(ModelFailed):
            await batcher.submit(row(POISON), 1, deadline(), "alone")

    assert [record.getMessage() for record in caplog.records] == ["request alone failed: poisoned row"]


def test_output_rows_mismatch_says_which_output_and_why():
    requests = [PendingRequest((np.ones((2, 3), np.float32),), 2, 0.0, 1.0, None)]

    results, compute_s = run_batch(lambda feeds: [feeds[0], feeds[0][:1]], requests)

    assert compute_s is None
    assert str(results[0]) == "output 1 has shape [1, 3] for 2 input rows"


def test_engine_gate_admits_one_batch_at_a_time_by_default_and_wakes_its_queues_on_release():
    gate, woken = EngineGate(), asyncio.Event()
    gate.waiters.append(woken.set)
    gate.in_flight = 1

    assert gate.is_idle is False
    gate.release()

    assert (gate.in_flight, gate.is_idle, woken.is_set()) == (0, True, True)


async def test_a_lone_request_costs_one_policy_decision_and_no_wake_up_after_its_answer(dispatch, monkeypatch):
    import serving.batcher as batcher_module

    decisions = []
    real_next_batch = batcher_module.next_batch
    monkeypatch.setattr(batcher_module, "next_batch", lambda queue, *args: decisions.append(len(queue)) or
                        real_next_batch(queue, *args))
    batcher = make_batcher(FakeModel(), dispatch)

    await batcher.submit(row(1), 1, deadline())
    for _ in range(5):  # let every callback the answer scheduled run
        await asyncio.sleep(0)

    assert decisions == [1]  # one decision, on a queue of one; none on the empty queue after
    await assert_settled(batcher)


class BrokenObserver(BatchObserver):
    def on_batch(self, requests, started_s, compute_s, depth) -> None:
        raise LookupError("metrics bug")


async def test_a_bug_after_the_answers_loses_no_answer_and_is_logged(dispatch, caplog):
    gate = EngineGate(1)
    batcher = make_batcher(FakeModel(), dispatch, gate=gate, observer=BrokenObserver())

    with caplog.at_level(logging.ERROR, logger="serving.batcher"):
        assert float((await batcher.submit(row(2), 1, deadline()))[0][0, 0]) == 4.0

    assert [record.getMessage() for record in caplog.records] == ["settling a batch failed; failing its requests"]
    await assert_settled(batcher, gate)


async def test_a_bug_before_the_answers_fails_the_batch_instead_of_stranding_it(dispatch, caplog):
    def broken_classifier(error: Exception):
        raise LookupError("classifier bug")

    batcher = make_batcher(FakeModel(), dispatch, classify_error=broken_classifier)

    with caplog.at_level(logging.ERROR, logger="serving.batcher"):
        with pytest.raises(ModelFailed, match="^model execution failed$"):
            await batcher.submit(row(POISON), 1, deadline())

    assert [record.getMessage() for record in caplog.records] == ["settling a batch failed; failing its requests"]
    await assert_settled(batcher)


def test_dispatch_threads_default_to_one_thread_at_the_creators_priority():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    threads = DispatchThreads("onnx-default")
    seen = []
    loop = asyncio.new_event_loop()
    try:
        names = sorted(thread.name for thread in threading.enumerate() if thread.name.startswith("onnx-default-"))
        threads.submit(loop, lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())), (),
                       lambda error, result: None)
    finally:
        threads.close()
        for thread in threading.enumerate():
            if thread.name.startswith("onnx-default-"):
                thread.join(timeout=2)
        loop.close()

    assert names == ["onnx-default-0"]
    assert seen == [base]


async def test_a_queued_request_larger_than_a_shrunk_batch_runs_alone_and_its_queue_mates_are_answered(dispatch):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch, max_batch_size=8)
    first = batcher.submit(row(0), 1, deadline())
    await wait_for_run(model)  # the engine is busy while the policy changes
    big = batcher.submit((np.ones((6, 4), np.float32),), 6, deadline())
    small = batcher.submit(row(1), 1, deadline())
    batcher.policy = replace(batcher.policy, max_batch_size=4)  # a live batching change (LoadedVersion.set_policy)

    model.open()
    await first

    assert [result[0].shape for result in await asyncio.wait_for(asyncio.gather(big, small), 3.0)] == [(6, 4), (1, 4)]
    assert model.batch_rows == [1, 6, 1]


async def test_a_shape_queue_kept_busy_does_not_starve_another_shape_of_the_same_engine(dispatch):
    model = FakeModel(delay_s=0.005)
    gate, latency = EngineGate(1), LatencyModel()
    busy = make_batcher(model, dispatch, gate=gate, latency=latency, max_batch_size=1, max_queue_size=1000)
    other = make_batcher(model, dispatch, gate=gate, latency=latency, max_batch_size=1, max_queue_size=1000)
    busy_answers = [busy.submit(row(1), 1, deadline()) for _ in range(5)]
    await asyncio.sleep(0.01)
    lone = other.submit(row(2, width=8), 1, deadline(1.0))

    async def keep_busy():  # a request after the lone one for every run: the busy queue is never empty
        while not lone.done():
            busy_answers.append(busy.submit(row(1), 1, deadline()))
            await asyncio.sleep(0.004)

    feeder = asyncio.create_task(keep_busy())
    try:
        assert first_values([await lone]) == [4.0]
    finally:
        feeder.cancel()
        await asyncio.gather(*busy_answers, return_exceptions=True)


async def test_a_request_batched_with_a_later_deadline_gets_its_504_at_its_own_deadline(dispatch):
    model = FakeModel(is_open=False)
    batcher = make_batcher(model, dispatch)
    first = batcher.submit(row(0), 1, deadline())
    await wait_for_run(model)  # the engine is busy: the next two leave together
    short = batcher.submit(row(1), 1, deadline(0.2))
    long = batcher.submit(row(2), 1, deadline(3.0))
    model.allow()
    await first
    await wait_for_run(model)  # their batch runs, held

    with pytest.raises(DeadlineExceeded):
        await asyncio.wait_for(short, 1.0)  # answered while the run goes on, not when it ends
    assert not long.done()
    model.open()
    assert first_values([await long]) == [4.0]


async def test_the_outputs_of_a_run_stopped_at_its_deadline_are_not_summarised(dispatch):
    """A run that outlived its requests' deadline was answered 504, yet its outputs, when it
    came back, went into the version's output summary: a canary's figures counted answers no
    client got, and the dispatch thread summarised them while the version's engine waited
    (a 1e9-element output: +4.8 GB and about 40 s after the 504, every request meanwhile 504)."""
    model = FakeModel(is_open=False)
    summarised = []
    batcher = make_batcher(model, dispatch, summarise=lambda outputs, rows, keep: summarised.append(rows))
    stopped = batcher.submit(row(1), 1, deadline(0.2))
    await wait_for_run(model)
    with pytest.raises(DeadlineExceeded, match="its run was stopped"):
        await asyncio.wait_for(stopped, 1.0)
    model.open()  # the run ends after all, with outputs (a single node checks no terminate flag)

    assert first_values([await batcher.submit(row(2), 1, deadline())]) == [4.0]
    assert summarised == [1], "only the answered request's outputs are summarised"
