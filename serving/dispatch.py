"""The one way a batch reaches ONNX Runtime: a version's own dispatch threads.

`DispatchThreads` are long-lived threads per loaded version that take batches from a
queue and deliver each batch's results to the loop in ONE `call_soon_threadsafe`: no
concurrent.futures.Future, no work item, no chained asyncio future. Models never run on
the event loop, however small (DESIGN.md's hot-path rule). Measured against the two
hand-offs this replaced (bench/serve_bench.py's worker, small model, wrk, alternating
runs on the 2-core box): a `run_in_executor` per batch answered no more requests and
spent as much or more CPU per request. Running batches predicted under 1 ms on the loop
thread itself was up to a fifth faster at concurrency 1 while the box was quiet, but fell
to ~520 req/s (from ~3,000) in 12 of 34 runs while neighbours kept the cores busy, and
gained nothing at concurrency 64. `EngineGate` counts one engine's batches in flight,
shared by its shape queues.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable


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
    """How many batches of one engine are in flight, shared by its shape queues; each
    queue's hook in `waiters` is called when a batch comes back (the engine has room)."""

    def __init__(self, max_in_flight: int = 1):
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.waiters: list[Callable[[], None]] = []
        self.queues: list = []  # the shape queues (serving.batcher.Batcher) sharing the engine

    @property
    def is_idle(self) -> bool:
        return self.in_flight < self.max_in_flight

    def release(self) -> None:
        self.in_flight -= 1
        for on_release in self.waiters:
            on_release()
