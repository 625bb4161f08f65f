"""serving/jobs/pipeline.py: a batch job's reader and writer threads hand over in order and fail in order."""

from __future__ import annotations

import queue
import threading

import pytest

from serving.jobs.pipeline import Drain, Prefetch, get_unless


def counting(limit: int, fail_at: int | None = None):
    def produce(stopping):
        for number in range(limit):
            if number == fail_at:
                raise ValueError(f"item {number} is unreadable")
            yield number
    return produce


def test_prefetch_yields_every_item_in_order():
    with Prefetch(counting(50)) as items:
        assert list(items) == list(range(50))


def test_prefetch_raises_the_producers_error_after_the_items_before_it():
    seen = []
    with pytest.raises(ValueError, match="item 3 is unreadable"), Prefetch(counting(10, fail_at=3)) as items:
        seen.extend(items)
    assert seen == [0, 1, 2]


def test_leaving_a_prefetch_early_stops_a_producer_that_waits():
    free: queue.Queue = queue.Queue()  # never refilled: the producer waits on it after one item

    def produce(stopping):
        free.put("buffer")
        while (buffer := get_unless(free, stopping)) is not None:
            yield buffer

    with Prefetch(produce, name="waiting-reader") as items:
        assert next(iter(items)) == "buffer"
    assert "waiting-reader" not in {thread.name for thread in threading.enumerate()}


def test_drain_consumes_every_item_in_order_by_close():
    consumed = []
    with Drain(consumed.append) as drain:
        for number in range(50):
            drain.put(number)
    assert consumed == list(range(50))


def test_a_consumer_error_is_raised_by_put_or_close_and_later_items_are_dropped():
    consumed = []
    failed = threading.Event()

    def consume(number):
        if number == 2:
            failed.set()
            raise OSError("disk full")
        consumed.append(number)

    with pytest.raises(OSError, match="disk full"), Drain(consume) as drain:
        for number in range(10):
            if number == 5:
                failed.wait(5)
            drain.put(number)
    assert consumed == [0, 1]


def test_an_earlier_consumer_error_replaces_a_later_error_of_the_caller():
    failed = threading.Event()

    def consume(number):
        failed.set()
        raise OSError(f"cannot write item {number}")

    with pytest.raises(OSError, match="cannot write item 0"), Drain(consume) as drain:
        drain.put(0)
        failed.wait(5)
        raise ValueError("the model failed on item 1")
