"""What a request refused for want of a slot is told, and what /readyz takes: through the
console's ASGI handler (console/handler.py), with views of the test's own."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from django.db import OperationalError, connection
from django.http import HttpResponse
from django.urls import path

from console import readiness
from console.handler import ConsoleASGIHandler
from console.views import readyz

pytestmark = pytest.mark.django_db(transaction=True)
release_slow = threading.Event()


def unreachable_view(request):
    raise OperationalError("connection to server at 127.0.0.1, port 1 failed: timeout expired")


def slow_view(request):
    release_slow.wait(10)
    return HttpResponse("done")


def fine_view(request):
    with connection.cursor() as cursor:  # the database answers
        cursor.execute("SELECT 1")
    return HttpResponse("fine")


def no_database_view(request):  # a 404, /healthz, an anonymous 401: they say nothing of the database
    return HttpResponse("needs no database")


urlpatterns = [path("down/", unreachable_view), path("slow/", slow_view), path("fine/", fine_view), path("nodb/", no_database_view),
               path("readyz", readyz)]


@pytest.fixture
def handler(settings):
    settings.ROOT_URLCONF = __name__
    settings.CONSOLE_MAX_REQUESTS, settings.CONSOLE_REQUEST_WAIT_S = 1, 0.2
    release_slow.clear()
    yield ConsoleASGIHandler()
    release_slow.set()


async def get(handler, path: str) -> dict:
    answer, asked = {"body": b""}, []

    async def receive():
        if asked:
            await asyncio.Event().wait()
        asked.append(True)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            answer["status"], answer["headers"] = message["status"], {name.lower(): value for name, value in message["headers"]}
        else:
            answer["body"] += message.get("body", b"")

    scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "scheme": "http",
             "server": ("testserver", 80), "client": ("127.0.0.1", 5000),
             "headers": [(b"host", b"testserver"), (b"accept", b"application/json")]}
    await asyncio.wait_for(handler(scope, receive, send), 15)
    return answer


async def refused_behind_a_slow_request(handler, path: str = "/fine/") -> dict:
    """``path`` while ``/slow/`` holds the one reads slot."""
    slow = asyncio.create_task(get(handler, "/slow/"))
    await asyncio.sleep(0.1)
    refused = await get(handler, path)
    release_slow.set()
    await slow
    release_slow.clear()
    return refused


def test_a_request_refused_while_the_database_is_unreachable_is_told_so_not_that_the_console_is_busy(handler):
    async def scenario():
        down = await get(handler, "/down/")
        return down, await refused_behind_a_slow_request(handler)

    down, refused = asyncio.run(scenario())

    assert down["status"] == 503
    assert refused["status"] == 503 and refused["headers"][b"retry-after"] == b"5"
    assert json.loads(refused["body"])["error"].startswith("the database is unavailable: 1 requests of this kind (reads) are waiting")


def test_once_the_database_answers_again_a_refusal_says_the_console_is_busy(handler):
    async def scenario():
        await get(handler, "/down/")
        await get(handler, "/fine/")
        return await refused_behind_a_slow_request(handler)

    refused = asyncio.run(scenario())

    assert refused["status"] == 503 and refused["headers"][b"retry-after"] == b"2"
    assert json.loads(refused["body"])["error"].startswith("the console is busy")


def test_an_answer_that_needed_no_database_leaves_the_outage_words_in_place(handler):
    # A liveness probe every few seconds made the refusals flip back to "busy" mid-outage.
    async def scenario():
        await get(handler, "/down/")
        await get(handler, "/nodb/")
        return await refused_behind_a_slow_request(handler)

    refused = asyncio.run(scenario())

    assert json.loads(refused["body"])["error"].startswith("the database is unavailable")


def test_readiness_probes_take_no_reads_slot(handler, monkeypatch):
    monkeypatch.setattr(readiness, "CHECKS", {"database": (lambda: time.sleep(0.6), "cannot connect or query")})

    async def scenario():
        probe = asyncio.create_task(get(handler, "/readyz"))
        await asyncio.sleep(0.1)
        read = await get(handler, "/fine/")
        return read, await probe

    read, probe = asyncio.run(scenario())

    assert read["status"] == 200  # a probe held the one reads slot, and this read was refused after 0.2 s
    assert probe["status"] == 200


def test_concurrent_readiness_calls_share_one_check(monkeypatch):
    checks = []

    def slow_check():
        checks.append(time.monotonic())
        time.sleep(0.5)

    monkeypatch.setattr(readiness, "CHECKS", {"database": (slow_check, "cannot connect or query")})
    start = threading.Barrier(8)
    answers = []

    def probe():
        start.wait()
        answers.append(readiness.shared_readiness())

    threads = [threading.Thread(target=probe) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert answers == [{"ready": True, "database": {"ok": True}}] * 8
    assert len(checks) == 1  # each probe opened connections of its own: 8


def test_a_readiness_call_after_a_check_ended_checks_again(monkeypatch):
    checks = []
    monkeypatch.setattr(readiness, "CHECKS", {"database": (lambda: checks.append(1), "cannot connect or query")})

    readiness.shared_readiness()
    readiness.shared_readiness()

    assert len(checks) == 2  # never a stale answer: a probe that comes after a check sees a new one


def test_a_readiness_probe_that_finds_the_database_down_sets_the_outage_words(handler, monkeypatch):
    def unreachable():
        raise OperationalError("timeout expired")

    monkeypatch.setattr(readiness, "CHECKS", {"database": (unreachable, "cannot connect or query")})

    async def scenario():
        probe = await get(handler, "/readyz")
        return probe, await refused_behind_a_slow_request(handler)

    probe, refused = asyncio.run(scenario())

    assert probe["status"] == 503
    assert json.loads(refused["body"])["error"].startswith("the database is unavailable")
