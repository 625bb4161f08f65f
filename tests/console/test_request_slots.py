"""How many requests one console process runs at once (console/request_slots.py): each
running request holds a thread and a database connection, so the rest wait for a slot of
their kind, briefly, then are a 503 naming the cause."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from rest_framework.authtoken.models import Token

from console.handler import ConsoleASGIHandler
from console.request_slots import Refusal, RequestSlots, busy_response, request_kind


class Requests:
    """Requests run under ``slots`` until ``release``; what each was answered."""

    def __init__(self, slots: RequestSlots):
        self.slots = slots
        self.running = 0
        self.release = asyncio.Event()

    async def run(self, method: str = "POST", path: str = "/api/models/tiny/release/", fail: bool = False,
                  authorization: bytes | None = None):
        async with self.slots.held(request_kind(method, path, authorization)) as refusal:
            if refusal is not None:
                return refusal
            self.running += 1
            try:
                await self.release.wait()
                if fail:
                    raise RuntimeError("the view failed")
                return "ran"
            finally:
                self.running -= 1

    def start(self, *args, **kwargs) -> asyncio.Task:
        return asyncio.create_task(self.run(*args, **kwargs))


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_request_past_its_kinds_slots_waits_for_one_and_runs_when_one_frees():
    async def scenario():
        requests = Requests(RequestSlots(limit=2, wait_s=5))
        calls = [requests.start() for _ in range(3)]
        await settle()
        running_while_full = requests.running
        requests.release.set()
        return running_while_full, await asyncio.gather(*calls)

    running_while_full, answers = asyncio.run(scenario())
    assert running_while_full == 2 and answers == ["ran"] * 3


def test_a_request_that_waits_past_the_wait_is_refused_and_holds_nothing():
    async def scenario():
        requests = Requests(RequestSlots(limit=1, wait_s=0.2))
        first = requests.start()
        await settle()
        started = time.monotonic()
        refusal = await requests.run()
        waited_s = time.monotonic() - started
        requests.release.set()
        await first
        return refusal, waited_s, await requests.run()

    refusal, waited_s, after = asyncio.run(scenario())
    assert refusal == ("changes", 1) and 0.15 < waited_s < 1.0
    assert after == "ran"


def test_the_refusal_is_a_503_naming_the_cause_with_retry_after():
    response = busy_response("/api/models/tiny/release/", "*/*", Refusal("changes", 1))

    assert response.status_code == 503 and response["Retry-After"] == "2" and response["Cache-Control"] == "no-store"
    message = json.loads(response.content)["error"]
    assert message.startswith("the console is busy: 1 requests of this kind (changes) are running") and "CONSOLE_MAX_REQUESTS" in message


def test_a_page_refused_is_a_503_page_rendered_without_the_database():
    response = busy_response("/models/tiny/", "text/html", Refusal("reads", 16))

    assert response.status_code == 503 and response["Content-Type"].startswith("text/html")
    assert b"The console is busy" in response.content and b"16 requests of this kind (reads)" in response.content


def test_a_refusal_carries_the_security_headers_the_middleware_would_have_added():
    response = busy_response("/models/tiny/", "text/html", Refusal("reads", 16))

    assert "frame-ancestors 'none'" in response["Content-Security-Policy"] and "script-src" not in response["Content-Security-Policy"]
    assert response["X-Frame-Options"] == "DENY" and response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"


def test_a_pages_script_that_asks_for_json_gets_the_refusal_as_json():
    response = busy_response("/models/tiny/release/", "application/json", Refusal("changes", 16))

    assert json.loads(response.content)["error"].startswith("the console is busy")


WORKER = b"Bearer " + b"w" * 8


@pytest.fixture
def worker_token(settings):
    settings.SERVING_WORKER_TOKEN = "w" * 8


def test_changes_filling_their_slots_hold_up_neither_reads_nor_workers_calls_nor_sign_ins(worker_token):
    async def scenario():
        requests = Requests(RequestSlots(limit=1, wait_s=0))
        calls = [requests.start("POST", "/api/models/tiny/release/"), requests.start("GET", "/api/models/"),
                 requests.start("POST", "/api/serving/reports", authorization=WORKER), requests.start("POST", "/login/")]
        await settle()
        running = requests.running
        requests.release.set()
        return running, await asyncio.gather(*calls)

    running, answers = asyncio.run(scenario())
    assert running == 4 and answers == ["ran"] * 4


def test_only_the_worker_token_takes_a_workers_slot(worker_token):
    assert request_kind("POST", "/api/serving/reports", WORKER) == "workers"
    assert request_kind("GET", "/api/serving/state", WORKER) == "workers"
    assert request_kind("GET", "/api/models/tiny/versions/2/artifact", WORKER) == "workers"  # a worker loading a version
    # Anyone else's call there is a change or a read like any other: it cannot crowd out the workers.
    assert request_kind("POST", "/api/serving/reports", None) == "changes"
    assert request_kind("POST", "/api/serving/reports", b"Bearer " + b"x" * 8) == "changes"
    assert request_kind("GET", "/api/serving/state", b"Token abc") == "reads"


def test_sign_ins_have_slots_of_their_own():
    assert request_kind("POST", "/login/", None) == "sign-in"
    assert request_kind("POST", "/admin/login/", None) == "sign-in"
    assert request_kind("GET", "/login/", None) == "reads"


def test_a_request_cancelled_as_its_slot_comes_does_not_run_and_gives_the_slot_back():
    # A client that left as the slot came: with wait_for (Python 3.11) the request took it
    # and ran on for nobody (audit exports for minutes after a storm of hang-ups).
    async def scenario():
        slots = RequestSlots(limit=1, wait_s=5)
        await slots.take("reads")
        waiter = asyncio.create_task(slots.take("reads"))
        await settle()
        slots.give_back("reads")  # the slot goes to the waiter...
        waiter.cancel()  # ...as its client leaves
        try:
            await waiter
            outcome = "ran"
        except asyncio.CancelledError:
            outcome = "cancelled"
        return outcome, await asyncio.wait_for(slots.take("reads"), 1)

    assert asyncio.run(scenario()) == ("cancelled", None)


def test_liveness_takes_no_slot():
    async def scenario():
        requests = Requests(RequestSlots(limit=1, wait_s=0))
        page = requests.start("GET", "/models/")
        await settle()
        liveness = requests.start("GET", "/healthz")
        await settle()
        running = requests.running
        requests.release.set()
        return running, await asyncio.gather(page, liveness)

    running, answers = asyncio.run(scenario())
    assert running == 2 and answers == ["ran", "ran"]


def test_a_flood_waits_its_turn_and_none_is_refused_before_it_waited():
    async def scenario():
        requests = Requests(RequestSlots(limit=1, wait_s=30))
        calls = [requests.start() for _ in range(200)]
        await settle()
        requests.release.set()
        return await asyncio.gather(*calls)

    assert asyncio.run(scenario()) == ["ran"] * 200


def test_a_request_that_fails_gives_its_slot_back():
    async def scenario():
        requests = Requests(RequestSlots(limit=1, wait_s=0))
        requests.release.set()
        for _ in range(2):
            with pytest.raises(RuntimeError):
                await requests.run(fail=True)
        return await requests.run()

    assert asyncio.run(scenario()) == "ran"


@pytest.mark.django_db(transaction=True)
def test_a_client_still_sending_its_body_holds_no_slot(settings):
    settings.CONSOLE_MAX_REQUESTS = 1
    handler = ConsoleASGIHandler()

    async def call(method: str, body_arrives: asyncio.Event) -> int:
        answer = {}
        sent_body = False

        async def receive():
            nonlocal sent_body
            if sent_body:  # Django listens for a disconnect while the view runs: none comes
                await asyncio.Event().wait()
            await body_arrives.wait()
            sent_body = True
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]

        scope = {"type": "http", "method": method, "path": "/api/models/", "query_string": b"", "scheme": "http",
                 "server": ("testserver", 80), "client": ("127.0.0.1", 5000), "headers": [(b"host", b"testserver")]}
        await handler(scope, receive, send)
        return answer["status"]

    async def scenario():
        slow_body, at_once = asyncio.Event(), asyncio.Event()
        at_once.set()
        slow = asyncio.create_task(call("POST", slow_body))
        await settle()
        second = await asyncio.wait_for(call("POST", at_once), 10)
        slow_body.set()
        return second, await slow

    second, first = asyncio.run(scenario())
    assert second != 503 and first != 503, (second, first)


class AsgiClient:
    """Requests straight to a ConsoleASGIHandler; ``reading`` False: the client takes the
    answer's head and then reads nothing until ``resume`` is set."""

    def __init__(self, handler, authorization: str):
        self.handler = handler
        self.authorization = authorization
        self.resume = asyncio.Event()

    async def get(self, path: str, query: bytes = b"", reading: bool = True, started: asyncio.Event | None = None) -> dict:
        answer = {}
        sent_body = False

        async def receive():
            nonlocal sent_body
            if sent_body:  # no disconnect comes
                await asyncio.Event().wait()
            sent_body = True
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                if started is not None:
                    started.set()
            elif not reading:
                await self.resume.wait()  # a full socket buffer: the send waits

        scope = {"type": "http", "method": "GET", "path": path, "query_string": query, "scheme": "http",
                 "server": ("testserver", 80), "client": ("127.0.0.1", 5000),
                 "headers": [(b"host", b"testserver"), (b"authorization", self.authorization.encode())]}
        await self.handler(scope, receive, send)
        return answer


@pytest.mark.django_db(transaction=True)
def test_a_slow_reader_of_a_stream_that_reads_the_database_holds_no_slot(settings, digits, operator):
    # It held a streams slot until its last byte: 16 slow readers of a long audit export
    # kept every other export waiting, then refused.
    settings.CONSOLE_MAX_REQUESTS, settings.CONSOLE_REQUEST_WAIT_S = 1, 0.3
    client = AsgiClient(ConsoleASGIHandler(), f"Token {Token.objects.create(user=operator).key}")
    audit_csv = "/api/models/digits/audit/"

    async def scenario():
        started = asyncio.Event()
        slow = asyncio.create_task(client.get(audit_csv, b"format=csv", reading=False, started=started))
        await asyncio.wait_for(started.wait(), 10)
        read = await asyncio.wait_for(client.get("/api/models/"), 10)
        static = await asyncio.wait_for(client.get("/static/css/console.css"), 10)
        second_csv = await asyncio.wait_for(client.get(audit_csv, b"format=csv"), 10)
        client.resume.set()
        return read, static, second_csv, await asyncio.wait_for(slow, 10)

    read, static, second_csv, first_csv = asyncio.run(scenario())
    assert read["status"] == 200 and static["status"] == 200
    assert second_csv["status"] == 200  # the one streams slot is free while the first client reads
    assert first_csv["status"] == 200


def test_a_page_refused_while_the_database_is_unreachable_says_the_database_is_unavailable():
    response = busy_response("/models/tiny/", "text/html", Refusal("reads", 16), database_unavailable=True)

    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert b"The database is unavailable" in response.content and b"The console is busy" not in response.content


def test_readiness_probes_have_slots_of_their_own():
    assert request_kind("GET", "/readyz", None) == "probes"
    assert request_kind("GET", "/healthz", None) is None
