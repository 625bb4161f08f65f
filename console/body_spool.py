"""Django's ASGI handler, answering 507 when the request body cannot be spooled, and
running so many requests at once (``console.request_slots``).

Django reads a whole request body into a temporary file (in memory up to
``FILE_UPLOAD_MAX_MEMORY_SIZE``, then in ``TMPDIR``) before any view runs. When that file
system is full the write raises out of the handler, and uvicorn answered a plain-text
500 with a traceback in its log. Here the same failure is a 507 naming the full
directory, sent before any view ran: nothing was read into the store or recorded, and
the spooled part is released with the failed read.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler

from console.body_limit import send_refusal
from console.request_slots import RequestSlots, busy_response
from registry.artifacts import storage


class BodySpoolFull(Exception):
    """The request body's temporary file could not grow: its file system is full."""

    def __init__(self, errno: int) -> None:
        super().__init__(errno)
        self.errno = errno


def spool_full_message(errno: int) -> str:
    directory = tempfile.gettempdir()
    try:
        room = f" ({shutil.disk_usage(directory).free} bytes free)"
    except OSError:
        room = ""
    return (f"the console's temporary space for request bodies ({directory}, TMPDIR) is full: "
            f"{os.strerror(errno).lower()}{room}; nothing was kept: send it again once space is freed")


class ConsoleASGIHandler(ASGIHandler):
    """Django's handler; a full spool is a 507 instead of an exception out of the app, and
    a request runs (a thread, a database connection) only with a slot of its kind."""

    def __init__(self):
        super().__init__()
        self.slots = RequestSlots(limit=settings.CONSOLE_MAX_REQUESTS, wait_s=settings.CONSOLE_REQUEST_WAIT_S)

    async def run_get_response(self, request):
        # Here, not in front of the handler: the body has arrived, so a client that sends
        # it slowly holds no slot. A streamed answer is sent after its slot is given back.
        async with self.slots.held(request.method, request.path) as refusal:
            if refusal is not None:
                return busy_response(request.path, refusal)
            return await super().run_get_response(request)

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
