"""The console's HTTP/1.1 protocol: uvicorn's h11 one, with a deadline for a request's head.

uvicorn closes a connection kept alive after an answer (``--timeout-keep-alive``, 5 s) but
waits for ever on one that has sent nothing yet or only part of a request head: 20,000
such connections from one client held 20,000 of the console's file descriptors, each
until the client let go. Here a connection has ``CONSOLE_CLIENT_WAIT_S`` from its opening
(or from the first byte after an answer) to send a whole request head, as Apache's
``mod_reqtimeout`` (``header=20``) and nginx's ``client_header_timeout`` give it; then a
part-sent head is answered 408 and the connection closed, and one that sent nothing is
closed. The body's own deadline is ``console.body_limit``'s, where the app reads it.

Run by ``--http console.http_protocol:HeadTimedH11Protocol`` (``console.processes``,
the Dockerfile, compose and the Kubernetes manifests). uvicorn imports it before the app,
so the setting is read when a connection opens, once Django is set up. It also tells the
registry when the process begins to stop (``shutdown``; ``registry.process_stop``).
"""

from __future__ import annotations

import asyncio
import json

import h11
from django.conf import settings
from uvicorn.protocols.http.h11_impl import H11Protocol

from registry import process_stop


def timed_out_answer(wait_s: float) -> bytes:
    body = json.dumps({"error": f"the request head did not arrive whole within {wait_s:g} seconds (CONSOLE_CLIENT_WAIT_S); "
                                "the connection is closed"}).encode()
    head = f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


class HeadTimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol; a request head must arrive whole within ``CONSOLE_CLIENT_WAIT_S``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_wait_s = settings.CONSOLE_CLIENT_WAIT_S
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting_for_a_head():
            if self._head_timer is None:  # the next request's first bytes, after an answer
                self._arm_head_timer()
        else:
            self._disarm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Kept alive: uvicorn's keep-alive timer closes it if nothing comes, and the head's
        # starts again with the next request's first bytes (data_received).
        self._disarm_head_timer()

    def shutdown(self) -> None:
        # uvicorn's graceful stop: its socket is closed, and it asks each open connection
        # to finish. A drill still answering here hears no worker from now on (registry.process_stop).
        process_stop.mark_stopping()
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _waiting_for_a_head(self) -> bool:
        """No request is being read or answered, and the client's side has begun none whole."""
        return self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self._head_wait_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        # A websocket's upgrade hands the transport to another protocol: not ours to close.
        if self.transport.is_closing() or self.transport.get_protocol() is not self or not self._waiting_for_a_head():
            return
        if self.conn.their_state is h11.IDLE and self._has_part_of_a_head():
            self.transport.write(timed_out_answer(self._head_wait_s))
        self.transport.close()

    def _has_part_of_a_head(self) -> bool:
        return bool(self.conn.trailing_data[0])
