"""The console closes each request's database connection on the thread its view ran on,
however the request ends and whatever DATABASE_CONN_MAX_AGE_S says (console/handler.py):
under ASGI every request has a thread of its own, so a connection kept open is never
used again, and slow readers or clients that left kept one each."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.db import connections
from django.http import HttpResponse, StreamingHttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from console import stream_slot
from console.handler import ConsoleASGIHandler
from registry.api.streams import LINES_PER_HOP, database_stream

pytestmark = pytest.mark.django_db(transaction=True)
used = []  # the connection wrapper each request's view or stream used


@csrf_exempt
def slow_view(request):
    connection = connections["default"]
    connection.ensure_connection()
    used.append(connection)
    time.sleep(0.3)
    return HttpResponse("done")


def stream_view(request):
    def lines():  # reads the database for its first line and again for its last, two takes later
        for number in range(LINES_PER_HOP + 1):
            if number in (0, LINES_PER_HOP):
                connection = connections["default"]
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
                used.append(connection)
            yield b"line\n"

    return database_stream(request, StreamingHttpResponse(lines()))


urlpatterns = [path("slow/", slow_view), path("stream/", stream_view)]


@pytest.fixture
def handler(settings):
    settings.ROOT_URLCONF = __name__
    kept = connections.settings["default"].get("CONN_MAX_AGE", 0)
    connections.settings["default"]["CONN_MAX_AGE"] = 60  # Django's own close would keep it
    used.clear()
    yield ConsoleASGIHandler()
    connections.settings["default"]["CONN_MAX_AGE"] = kept


async def call(handler, path: str, hang_up_after_s: float | None = None, on_part=None) -> None:
    """One request; its client hangs up ``hang_up_after_s`` after the view (or stream) first
    used the database, or never. Timed from the request instead, a loaded box had not begun
    the view when the client left, and nothing was used (1 run in about 10 here)."""
    body_sent = False

    async def receive():
        nonlocal body_sent
        if body_sent:
            if hang_up_after_s is None:
                await asyncio.Event().wait()
            while not used:
                await asyncio.sleep(0.005)
            await asyncio.sleep(hang_up_after_s)
            return {"type": "http.disconnect"}
        body_sent = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body") and on_part is not None:
            await on_part()

    scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "scheme": "http",
             "server": ("testserver", 80), "client": ("127.0.0.1", 5000), "headers": [(b"host", b"testserver")]}
    await handler(scope, receive, send)


@pytest.mark.parametrize("hang_up_after_s", [None, 0.05], ids=["answered", "client left while the view ran"])
def test_a_requests_connection_is_closed_however_it_ends(handler, hang_up_after_s):
    asyncio.run(call(handler, "/slow/", hang_up_after_s))

    assert len(used) == 1 and used[0].connection is None


def test_a_database_stream_keeps_its_connection_while_its_client_keeps_up(handler):
    open_while_sent = []

    async def reads_at_once():
        open_while_sent.append(used[-1].connection is not None)

    asyncio.run(call(handler, "/stream/", on_part=reads_at_once))

    assert len(used) == 2 and used[0] is used[1]  # one connection for both reads, closed once sent
    assert open_while_sent[0] and used[-1].connection is None


def test_a_database_stream_closes_its_connection_while_its_client_reads_slowly(handler):
    open_after_a_slow_read = []

    async def reads_slowly():
        if not open_after_a_slow_read:  # the first part only
            await asyncio.sleep(stream_slot.KEEP_S * 3)
            open_after_a_slow_read.append(used[-1].connection is not None)

    asyncio.run(call(handler, "/stream/", on_part=reads_slowly))

    assert len(used) == 2 and used[-1].connection is None
    assert open_after_a_slow_read and not any(open_after_a_slow_read)  # it held one open to the last byte before


def test_a_database_stream_whose_client_goes_mid_way_gives_back_its_slot_and_connection(handler, settings):
    async def never_reads_on():
        await asyncio.sleep(30)  # cut short when the client goes

    asyncio.run(asyncio.wait_for(call(handler, "/stream/", hang_up_after_s=0.2, on_part=never_reads_on), 10))

    assert handler.slots.semaphores["streams"]._value == settings.CONSOLE_MAX_REQUESTS
    assert used and used[-1].connection is None
