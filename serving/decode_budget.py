"""The memory that decoding large request bodies takes, bounded together.

A JSON body becomes Python objects before it becomes an array: about 18 bytes of memory
for each byte of a body of numbers, 31 of empty objects (one 64 MB body of numbers took a
worker from 96 MB to 1.1 GB).
The body buffer (``serving.http_request.BodyBuffer``) bounds bodies while they arrive and
is given back once a body is whole; the decode came after it, bounded by nothing: six
62 KB gzip requests, each inflating to 64 MB of numbers, took a worker to 4.8 GB and held
other clients' requests up to 10.8 s. A body decoded off the event loop (over
``dataplane.DECODE_OFF_LOOP_BYTES``) now first waits here until its estimated cost fits
beside the decodes under way, in its turn, within its deadline; one costing more than
the whole budget is decoded alone, so no valid body is refused for its size here. The
bodies waiting are bounded by the budget too (503 past it).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from contextlib import asynccontextmanager

# Bytes of memory per byte of JSON while it is parsed and converted: numbers take about 18,
# empty objects ({},{},…) about 31.
JSON_EXPANSION = 32


def decode_cost(body_bytes: int, json_bytes: int | None = None) -> int:
    """The memory a body's decode is taken to need: its JSON part expanded, a binary part
    (the binary tensor extension, read in place) once."""
    json_part = body_bytes if json_bytes is None else min(json_bytes, body_bytes)
    return json_part * JSON_EXPANSION + (body_bytes - json_part)


# An answer's encode holds about this many copies of its bytes: the slices' JSON, their
# join, and the document around it (serving.protocol._sliced_json).
ENCODE_COPIES = 3


def encode_cost(answer_bytes: int) -> int:
    """The memory a large answer's encode is taken to need."""
    return answer_bytes * ENCODE_COPIES


class DecodeTimedOut(Exception):
    """The deadline passed while a decode waited for room."""


class DecodeQueueFull(Exception):
    """The bodies already waiting for their decode hold the whole budget: a waiting body is
    its bytes in memory (inflated, for a gzip one), counted nowhere else; 150 gzip bodies of
    8 KB, 8.4 MB each inflated, waited together and took a worker to 1.1 GB."""


class DecodeBudget:
    """Decodes start in the order they asked: a decode costing more than the whole budget,
    which starts only when none runs, was starved by smaller ones that kept overlapping
    until its deadline refused it (a review's experiment)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.held = 0
        self._room: asyncio.Condition | None = None  # made on the serving loop, at first use
        self._waiting: deque[object] = deque()  # one ticket per decode waiting, in arrival order
        self.waiting_bytes = 0  # the bodies of the decodes waiting

    def _may_start(self, ticket: object, cost: int) -> bool:
        return self._waiting[0] is ticket and (self.held == 0 or self.held + cost <= self.max_bytes)

    @asynccontextmanager
    async def hold(self, cost: int, deadline_s: float, body_bytes: int = 0):
        """Hold ``cost`` bytes while the block runs; DecodeTimedOut when its turn and room do
        not come before ``deadline_s`` (monotonic clock); DecodeQueueFull at once when it
        would wait and the ``body_bytes`` of those waiting, its own with them, pass the budget."""
        if self._room is None:
            self._room = asyncio.Condition()
        room, ticket = self._room, object()
        async with room:
            self._waiting.append(ticket)
            try:
                if not self._may_start(ticket, cost):
                    if self.waiting_bytes + body_bytes > self.max_bytes:
                        raise DecodeQueueFull()
                    self.waiting_bytes += body_bytes
                    try:  # asyncio.timeout, not wait_for: 3.11's wait_for may swallow a cancel that meets the wake-up
                        async with asyncio.timeout(max(0.0, deadline_s - time.monotonic())):
                            await room.wait_for(lambda: self._may_start(ticket, cost))
                    finally:
                        self.waiting_bytes -= body_bytes
            except TimeoutError:
                raise DecodeTimedOut() from None
            finally:
                self._waiting.remove(ticket)
                room.notify_all()  # the next in line may start, or fit now
            self.held += cost
        try:
            yield
        finally:
            async with room:
                self.held -= cost
                room.notify_all()
