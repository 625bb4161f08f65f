"""Reading, running and writing a job's batches at the same time.

ONNX Runtime, file reads and file writes all release the GIL, so a reader thread can
fill the next batch and a writer thread write the previous outputs while the model
runs this batch. For a small model those copies cost as much as the model itself;
done one after another they would cap a job well below raw ONNX Runtime.

Each hand-over holds one item at most, so a small constant number of batches is in
memory at once (see serving/jobs/batch.py). An exception in a thread comes out in the
job's own thread, in the order it would have come without threads.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, Self, TypeVar

T = TypeVar("T")
_END = object()
WAIT_S = 0.1  # how often a thread blocked on a hand-over checks that the job still wants it


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error


def put_unless(hand_over: queue.Queue, item: object, stopping: threading.Event) -> bool:
    """Put `item`, waiting for room; False (not put) once `stopping` is set."""
    while not stopping.is_set():
        try:
            hand_over.put(item, timeout=WAIT_S)
        except queue.Full:
            continue
        return True
    return False


def get_unless(hand_over: queue.Queue, stopping: threading.Event) -> object | None:
    """The next item, waiting for one; None once `stopping` is set."""
    while not stopping.is_set():
        try:
            return hand_over.get(timeout=WAIT_S)
        except queue.Empty:
            continue
    return None


class Prefetch(Generic[T]):
    """Iterates `produce(stopping)` in a thread of its own, one item ahead of its consumer.

    `produce` gets the event that is set when the consumer leaves, for any wait of its
    own (see `get_unless`). Its exception is raised by the iteration after the items
    that came before it. Use as a context manager: leaving it stops the thread."""

    def __init__(self, produce: Callable[[threading.Event], Iterator[T]], name: str = "job-reader"):
        self._ready: queue.Queue = queue.Queue(maxsize=1)
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(produce,), name=name, daemon=True)

    def _run(self, produce) -> None:
        try:
            for item in produce(self.stopping):
                if not put_unless(self._ready, item, self.stopping):
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, who raises it
            put_unless(self._ready, _Raised(error), self.stopping)
            return
        put_unless(self._ready, _END, self.stopping)

    def __iter__(self) -> Iterator[T]:
        while (item := self._ready.get()) is not _END:
            if isinstance(item, _Raised):
                raise item.error
            yield item

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stopping.set()
        self._thread.join()


class Drain(Generic[T]):
    """Runs `consume(item)` in a thread of its own for each item `put`, in order.

    `put` waits while one item is already waiting. After `consume` fails, the items
    still coming are dropped, and `put` and `close` raise its exception. Leaving the
    context with an exception of the caller's: the queued items are dropped, and an
    exception of `consume` is raised instead, since it came from an earlier item."""

    def __init__(self, consume: Callable[[T], None], name: str = "job-writer"):
        self._consume = consume
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._dropping = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while (item := self._queue.get()) is not _END:
            if self.error is None and not self._dropping:
                try:
                    self._consume(item)
                except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
                    self.error = error

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def put(self, item: T) -> None:
        self._raise_error()
        self._queue.put(item)

    def close(self) -> None:
        """Wait until every item is consumed; raises `consume`'s exception, if any."""
        self._stop()
        self._raise_error()

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_END)
            self._thread.join()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
            return
        self._dropping = True
        self._stop()
        if self.error is not None and self.error is not exc:
            raise self.error from None
