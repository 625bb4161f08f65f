"""The console's ASGI handler: Django's, with two answers of its own before any view.

A request runs (a thread, a database connection) only with a slot of its kind
(``console.request_slots``), taken once its body has arrived; a streamed answer that reads
the database holds a slot of the streams kind until sent, and a streamed file goes
without the request's connection. A request body the temporary space cannot hold is a
507 (``console.body_spool``).
"""

from __future__ import annotations

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
            response = await super().run_get_response(request)
        if response.streaming:
            return await self._streamed(request, response)
        return response

    async def _streamed(self, request, response):
        """A file's stream goes without the request's database connection; one that reads
        the database while sent holds a slot of the streams kind until its last byte."""
        if not reads_database_while_sent(response):
            await sync_to_async(_close_connections)()  # in the request's thread, whose connections they are
            return response
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


def _close_connections() -> None:
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()
