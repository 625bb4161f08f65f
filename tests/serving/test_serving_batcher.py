"""The batcher loop on a real event loop, with a fake model (a function of the inputs)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from serving.batcher import Batcher, BatchObserver, BatchPolicy, DispatchThreads, EngineGate, LatencyModel
from serving.errors import BadRequest, DeadlineExceeded, ModelFailed, QueueFull


class FakeModel:
    """Doubles its input; records batch sizes; can be slowed down or made to fail."""

    def __init__(self, delay_s: float = 0.0, error: Exception | None = None):
        self.delay_s, self.error = delay_s, error
        self.batch_rows: list[int] = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, feeds):
        self.release.wait(5)
        self.batch_rows.append(feeds[0].shape[0])
        time.sleep(self.delay_s)
        if self.error:
            raise self.error
        return [feeds[0] * 2]


@pytest.fixture
def executor():
    with ThreadPoolExecutor(2) as pool:
        yield pool


def make_batcher(model, executor, latency=None, **policy) -> Batcher:
    defaults = dict(max_batch_size=8, max_queue_delay_s=0.002, max_queue_size=64)
    return Batcher(model, BatchPolicy(**{**defaults, **policy}), executor, EngineGate(1), latency or LatencyModel(),
                   observer=BatchObserver())


def row(value: float, width: int = 4) -> tuple[np.ndarray]:
    return (np.full((1, width), value, dtype=np.float32),)


def deadline(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


async def test_outputs_are_split_back_to_their_requests(executor):
    model = FakeModel()
    model.release.clear()  # hold the engine so the rest queue into one batch
    batcher = make_batcher(model, executor)
    first = batcher.submit(row(0), 1, deadline())
    await asyncio.sleep(0.01)
    futures = [batcher.submit(row(value), 1, deadline()) for value in (1, 2, 3)]
    model.release.set()

    results = await asyncio.gather(first, *futures)

    assert [float(result[0][0, 0]) for result in results] == [0.0, 2.0, 4.0, 6.0]
    assert model.batch_rows == [1, 3]


async def test_lone_request_is_not_delayed_by_the_queue_window(executor):
    batcher = make_batcher(FakeModel(), executor, max_queue_delay_s=1.0)
    started_s = time.monotonic()

    await batcher.submit(row(1), 1, deadline())

    assert time.monotonic() - started_s < 0.2


async def test_full_queue_refuses_at_once(executor):
    model = FakeModel()
    model.release.clear()
    batcher = make_batcher(model, executor, max_queue_size=2)
    batcher.submit(row(0), 1, deadline())
    await asyncio.sleep(0.01)  # first one is now running; two more fill the queue
    queued = [batcher.submit(row(1), 1, deadline()), batcher.submit(row(2), 1, deadline())]

    with pytest.raises(QueueFull):
        batcher.submit(row(3), 1, deadline())
    assert batcher.depth == 2
    model.release.set()
    await asyncio.gather(*queued)


async def test_failed_batch_fails_every_request_in_it(executor):
    model = FakeModel(error=RuntimeError("boom"))
    model.release.clear()
    batcher = make_batcher(model, executor)
    first = batcher.submit(row(0), 1, deadline())
    await asyncio.sleep(0.01)
    rest = [batcher.submit(row(value), 1, deadline()) for value in (1, 2)]
    model.release.set()

    results = await asyncio.gather(first, *rest, return_exceptions=True)

    assert [type(result) for result in results] == [ModelFailed, ModelFailed, ModelFailed]


async def test_request_past_its_deadline_gets_504_and_is_not_computed(executor):
    model = FakeModel()
    model.release.clear()
    batcher = make_batcher(model, executor)
    running = batcher.submit(row(0), 1, deadline())
    await asyncio.sleep(0.01)
    late = batcher.submit(row(1), 1, deadline(0.05))

    with pytest.raises(DeadlineExceeded):
        await late
    model.release.set()
    await running
    assert model.batch_rows == [1]


async def test_request_with_more_rows_than_max_batch_size_is_refused(executor):
    batcher = make_batcher(FakeModel(), executor, max_batch_size=4)

    with pytest.raises(BadRequest, match="exceeds max_batch_size 4"):
        batcher.submit((np.zeros((5, 4), np.float32),), 5, deadline())


async def test_concurrent_requests_share_batches(executor):
    model = FakeModel(delay_s=0.005)
    batcher = make_batcher(model, executor, max_batch_size=16)

    await asyncio.gather(*(batcher.submit(row(i), 1, deadline()) for i in range(64)))

    assert max(model.batch_rows) > 1
    assert sum(model.batch_rows) == 64
    assert max(model.batch_rows) <= 16


async def test_overload_is_refused_at_once_when_the_deadline_cannot_be_met(executor):
    latency = LatencyModel()
    latency.observe(1, 0.010)
    latency.observe(8, 0.080)  # 10 ms per row
    model = FakeModel()
    model.release.clear()
    batcher = make_batcher(model, executor, latency=latency, latency_target_s=0.045)
    accepted = [batcher.submit(row(i), 1, deadline()) for i in range(4)]

    with pytest.raises(QueueFull, match="overloaded"):
        batcher.submit(row(9), 1, deadline())
    model.release.set()
    await asyncio.gather(*accepted)


async def test_drain_waits_for_queued_and_running_batches(executor):
    batcher = make_batcher(FakeModel(delay_s=0.02), executor)
    futures = [batcher.submit(row(i), 1, deadline()) for i in range(3)]

    assert await batcher.drain(timeout_s=2.0) is True
    assert all(future.done() for future in futures)


async def test_tiny_batches_can_run_on_the_loop_thread_when_allowed(executor):
    latency = LatencyModel()
    latency.observe(1, 0.00001)
    model = FakeModel()
    batcher = Batcher(model, BatchPolicy(), executor, EngineGate(1), latency, inline_max_s=0.001)
    threads = []
    original = model.__call__
    batcher._run = lambda feeds: threads.append(threading.get_ident()) or original(feeds)

    result = await batcher.submit(row(2), 1, deadline())

    assert float(result[0][0, 0]) == 4.0
    assert threads == [threading.get_ident()]


@pytest.fixture
def dispatch():
    threads = DispatchThreads("onnx-test", threads=1)
    yield threads
    threads.close()


async def test_dedicated_dispatch_thread_runs_batches_off_the_loop_and_splits_results(dispatch):
    model = FakeModel()
    model.release.clear()
    names = []
    batcher = make_batcher(lambda feeds: names.append(threading.current_thread().name) or model(feeds), dispatch)
    first = batcher.submit(row(0), 1, deadline())
    await asyncio.sleep(0.01)
    rest = [batcher.submit(row(value), 1, deadline()) for value in (1, 2)]
    model.release.set()

    results = await asyncio.gather(first, *rest)

    assert [float(result[0][0, 0]) for result in results] == [0.0, 2.0, 4.0]
    assert model.batch_rows == [1, 2]
    assert set(names) == {"onnx-test-0"}


async def test_failure_on_the_dispatch_thread_fails_that_batch_only(dispatch):
    calls = []

    def flaky(feeds):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return [feeds[0] * 2]

    batcher = make_batcher(flaky, dispatch)

    with pytest.raises(ModelFailed):
        await batcher.submit(row(1), 1, deadline())
    assert float((await batcher.submit(row(1), 1, deadline()))[0][0, 0]) == 2.0


def test_closing_dispatch_threads_ends_them():
    threads = DispatchThreads("onnx-close", threads=2)

    threads.close()

    for thread in threads._threads:
        thread.join(timeout=2)
    assert not any(thread.is_alive() for thread in threads._threads)
