"""The console's ASGI handler: Django's, with two answers of its own before any view.

A request runs (a thread, a database connection) only with a slot of its kind
(``console.request_slots``), taken once its body has arrived, and its connection is
closed before its slot is given back and its answer sent; a streamed answer that reads
the database holds a slot of the streams kind, and a connection, only while its client
keeps up (``console.stream_slot``). A request body the temporary
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
from console.stream_slot import StreamSlot
from registry.api.streams import in_hops, reads_database_while_sent
from registry.artifacts import storage


class ConsoleASGIHandler(ASGIHandler):
    """Django's handler; a full spool is a 507 instead of an exception out of the app, and
    a request runs (a thread, a database connection) only with a slot of its kind."""

    def __init__(self):
        super().__init__()
        self.slots = RequestSlots(limit=settings.CONSOLE_MAX_REQUESTS, wait_s=settings.CONSOLE_REQUEST_WAIT_S)
        # Whether the last answer that needed the database found it unreachable; what a
        # refusal for want of a slot then says (console.request_slots.busy_response).
        self.database_unreachable = False

    async def run_get_response(self, request):
        # Here, not in front of the handler: the body has arrived, so a client that sends
        # it slowly holds no slot.
        kind = request_kind(request.method, request.path, request.META.get("HTTP_AUTHORIZATION", "").encode("latin-1"))
        async with self.slots.held(kind) as refusal:
            if refusal is not None:
                return busy_response(request.path, request.headers.get("Accept", ""), refusal, self.database_unreachable)
            try:
                response = await super().run_get_response(request)
            finally:  # answered, failed, or its client went
                # Django closes it once the answer is sent, and a slow reader kept it open to
                # the last byte after the slot was given back (60 readers of an artifact: 60).
                used_database = await _close_request_connections()
        self._note_database(response, used_database)
        if response.streaming and reads_database_while_sent(response):
            return in_hops(response, StreamSlot(self.slots, _close_request_connections, self._database_unreachable))
        return response

    def _database_unreachable(self) -> None:
        self.database_unreachable = True

    def _note_database(self, response, used_database: bool) -> None:
        """Whether the database was found unreachable, by the last answer that tried it:
        one that needed none (/healthz, a 404, an anonymous 401) says nothing of it; /readyz
        checks it on a connection of its own and says which."""
        if getattr(response, "database_unreachable", False):
            self.database_unreachable = True
        elif (used_database and response.status_code < 500) or getattr(response, "database_answered", False):
            self.database_unreachable = False

    async def read_body(self, receive):
        try:
            return await super().read_body(receive)
        except OSError as error:
            if not storage.is_full(error) and not storage.is_too_large(error):
                raise
            full = BodySpoolFull(error.errno)
        # Raised outside the handler so that nothing chains the OSError, whose traceback
        # holds the failed read's frame and with it the spooled file and its disk space.
        raise full

    async def handle(self, scope, receive, send):
        try:
            return await super().handle(scope, receive, send)
        except BodySpoolFull as full:  # raised before the request was built: nothing was sent yet
            await send_refusal(send, 507, spool_full_message(full.errno), scope)


async def _close_request_connections() -> bool:
    """Closes the database connections of the request's thread (the one its view ran on),
    whatever DATABASE_CONN_MAX_AGE_S says: each request has a thread of its own under
    ASGI, so a connection kept open would never be used again. Shielded: a client that
    went still has its connection closed. Whether one was open (the request reached the
    database)."""
    return await asyncio.shield(sync_to_async(_close_connections)())


def _close_connections() -> bool:
    opened = False
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            opened = opened or connection.connection is not None
            connection.close()
    return opened
