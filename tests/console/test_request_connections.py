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


async def call(handler, path: str, hang_up_after_s: float | None = None, on_part=lambda: None) -> None:
    body_sent = False

    async def receive():
        nonlocal body_sent
        if body_sent:
            if hang_up_after_s is None:
                await asyncio.Event().wait()
            await asyncio.sleep(hang_up_after_s)
            return {"type": "http.disconnect"}
        body_sent = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            on_part()

    scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "scheme": "http",
             "server": ("testserver", 80), "client": ("127.0.0.1", 5000), "headers": [(b"host", b"testserver")]}
    await handler(scope, receive, send)


@pytest.mark.parametrize("hang_up_after_s", [None, 0.05], ids=["answered", "client left while the view ran"])
def test_a_requests_connection_is_closed_however_it_ends(handler, hang_up_after_s):
    asyncio.run(call(handler, "/slow/", hang_up_after_s))

    assert len(used) == 1 and used[0].connection is None


def test_a_database_stream_closes_its_connection_after_each_read_while_its_client_reads(handler):
    open_while_sent = []

    asyncio.run(call(handler, "/stream/", on_part=lambda: open_while_sent.append(used[-1].connection is not None)))

    assert len(used) == 2 and used[-1].connection is None
    assert open_while_sent and not any(open_while_sent)  # it held one open between its reads before
