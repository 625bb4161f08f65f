"""The console's ASGI handler: Django's, with two answers of its own before any view.

A request runs (a thread, a database connection) only with a slot of its kind
(``console.request_slots``), taken once its body has arrived, and its connection is
closed before its slot is given back and its answer sent; a streamed answer that reads
the database holds a slot of the streams kind until sent. A request body the temporary
space cannot hold is a 507 (``console.body_spool``).
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.db import connections

from console.body_limit import send_refusal
from console.body_spool import BodySpoolFull, spool_full_message
from console.request_slots import RequestSlots, busy_response, request_kind
from registry.api.streams import reads_database_while_sent
from registry.artifacts import storage


class ConsoleASGIHandler(ASGIHandler):
    """Django's handler; a full spool is a 507 instead of an exception out of the app, and
    a request runs (a thread, a database connection) only with a slot of its kind."""

    def __init__(self):
        super().__init__()
        self.slots = RequestSlots(limit=settings.CONSOLE_MAX_REQUESTS, wait_s=settings.CONSOLE_REQUEST_WAIT_S)

    async def run_get_response(self, request):
        # Here, not in front of the handler: the body has arrived, so a client that sends
        # it slowly holds no slot.
        kind = request_kind(request.method, request.path, request.META.get("HTTP_AUTHORIZATION", "").encode("latin-1"))
        async with self.slots.held(kind) as refusal:
            if refusal is not None:
                return busy_response(request.path, request.headers.get("Accept", ""), refusal)
            try:
                response = await super().run_get_response(request)
            finally:  # answered, failed, or its client went
                # Django closes it once the answer is sent, and a slow reader kept it open to
                # the last byte after the slot was given back (60 readers of an artifact: 60).
                await _close_request_connections()
        if response.streaming and reads_database_while_sent(response):
            return await self._with_stream_slot(request, response)
        return response

    async def _with_stream_slot(self, request, response):
        """A stream that reads the database while sent holds a slot of the streams kind
        until its last byte (its connection opens again at its first part)."""
        refusal = await self.slots.take("streams")
        if refusal is not None:
            await sync_to_async(response.close)()
            return busy_response(request.path, request.headers.get("Accept", ""), refusal)
        response.holds_stream_slot = True
        return response

    async def send_response(self, response, send):
        try:
            await super().send_response(response, send)
        finally:  # sent, failed or cancelled (the client went)
            if getattr(response, "holds_stream_slot", False):
                response.holds_stream_slot = False
                try:  # its cursor, then the connection it opened again, before the slot goes
                    await asyncio.shield(sync_to_async(response.close)())
                    await _close_request_connections()
                finally:
                    self.slots.give_back("streams")

    async def read_body(self, receive):
        try:
            return await super().read_body(receive)
        except OSError as error:
            if not storage.is_full(error):
                raise
            full = BodySpoolFull(error.errno)
        # Raised outside the handler so that nothing chains the OSError, whose traceback
        # holds the failed read's frame and with it the spooled file and its disk space.
        raise full

    async def handle(self, scope, receive, send):
        try:
            return await super().handle(scope, receive, send)
        except BodySpoolFull as full:  # raised before the request was built: nothing was sent yet
            await send_refusal(send, 507, spool_full_message(full.errno))


async def _close_request_connections() -> None:
    """Closes the database connections of the request's thread (the one its view ran on),
    whatever DATABASE_CONN_MAX_AGE_S says: each request has a thread of its own under
    ASGI, so a connection kept open would never be used again. Shielded: a client that
    went still has its connection closed."""
    await asyncio.shield(sync_to_async(_close_connections)())


def _close_connections() -> None:
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()
