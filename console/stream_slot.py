"""The slot of the streams kind a stream that reads the database holds (the audit CSV,
``registry.api.streams.database_stream``), and its connection: held from one take of
parts to the next while its client keeps up, given back, the connection closed, once the
client has not asked for the next take within ``KEEP_S``.

Held to the last byte, 16 slow readers of a long export held every streams slot for as
long as they cared to read, and every other export waited 5 s and was refused. Given
back after every take, a fast export of 300,000 events connected to PostgreSQL 601 times
and took 9.8 s instead of 6.4. A client that reads as fast as the parts come asks for the
next take within milliseconds; one that reads slowly, or not at all, holds neither the
slot nor a connection while it reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from console.request_slots import RequestSlots
from registry.db_unavailable import is_database_unavailable

KEEP_S = 0.1


class StreamSlot:
    """One stream's hold on a streams slot (``registry.api.streams.in_hops`` calls it)."""

    def __init__(self, slots: RequestSlots, close_connections: Callable[[], Awaitable[None]],
                 on_database_unreachable: Callable[[], None]):
        self.slots = slots
        self.close_connections = close_connections
        self.on_database_unreachable = on_database_unreachable
        self.holding = False
        self._timer: asyncio.TimerHandle | None = None
        self._release: asyncio.Task | None = None

    async def before_take(self) -> None:
        """A slot for the next take: the one still held when the client kept up, else a new
        one, waited for as long as it takes (the answer has begun)."""
        self._stop_timer()
        if self._release is not None:  # the client came back while the slot was being given back
            await asyncio.shield(self._release)
        if not self.holding:
            await self.slots.take("streams", patient=True)
            self.holding = True

    def after_take(self) -> None:
        """Keep the slot and the connection for the next take if it comes within KEEP_S."""
        self._timer = asyncio.get_running_loop().call_later(KEEP_S, self._give_back_soon)

    async def finish(self, error: BaseException | None = None) -> None:
        """The stream ended (sent, failed, or its client went): the slot and the connection go now."""
        if error is not None and is_database_unavailable(error):
            self.on_database_unreachable()
        self._stop_timer()
        if self._release is not None:
            await asyncio.shield(self._release)
        await asyncio.shield(self._give_back())

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _give_back_soon(self) -> None:
        self._timer = None
        self._release = asyncio.ensure_future(self._give_back())  # in the stream's context: its request's thread
        self._release.add_done_callback(self._released)

    def _released(self, task: asyncio.Task) -> None:
        if self._release is task:
            self._release = None

    async def _give_back(self) -> None:
        if not self.holding:
            return
        self.holding = False
        try:
            await self.close_connections()
        finally:
            self.slots.give_back("streams")
