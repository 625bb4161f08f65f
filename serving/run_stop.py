"""Stopping a run that has outlived every request it serves.

A batch runs in a dispatch thread, and ONNX Runtime returns only when the run ends. A
model whose work grows with its input (a Loop whose trip count is an input, an Expand to
a size read from it) let one small request hold a core for as long as it named: an audit
ran 25 s past a 5 s deadline, and the thread ran on after the answer and after the model
was unloaded. Each batch's run now carries ONNX Runtime's own RunOptions; when the last
deadline among its requests passes, the loop sets ``terminate`` and answers them 504,
and ONNX Runtime stops at the next node (a Loop checks between iterations).

The options reach ``Engine.run`` through this thread's slot rather than every run
function's signature: the run is wrapped once per batch, on the dispatch thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import onnxruntime as ort

from serving import run_memory

_current = threading.local()


class RunStop:
    """One batch's stop: the RunOptions its runs carry, and whether it was stopped."""

    __slots__ = ("options", "stopped")

    def __init__(self, *, shrink: bool = True) -> None:
        self.options = ort.RunOptions()
        if shrink:
            run_memory.add_shrink_when_due(self.options)  # the batch's options are the one place to ask
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True
        self.options.terminate = True

    def running(self, run: Callable) -> Callable:
        """``run``, made under this stop's options (on whichever thread calls it)."""

        def run_stoppable(feeds):
            _current.options = self.options
            try:
                return run(feeds)
            finally:
                _current.options = None

        return run_stoppable


def current_options() -> ort.RunOptions | None:
    """The RunOptions of the batch this thread is running, if any."""
    return getattr(_current, "options", None)


@contextmanager
def stopped_after(timeout_s: float | None) -> Iterator[RunStop]:
    """A RunStop that stops its runs once ``timeout_s`` has passed (never with None): a
    warm-up or a benchmark has no request deadline to stop it, and a model that loops for
    ever at one batch size held its thread, and whatever waited for it, for good."""
    # No arena shrink: one stop covers every run of a warm-up, which would each shrink it
    # and leave the next batch's due shrink undone (the warm-up ran none before).
    stop = RunStop(shrink=False)
    timer = None if timeout_s is None else threading.Timer(timeout_s, stop.stop)
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield stop
    finally:
        if timer is not None:
            timer.cancel()
