"""What a request body may cost the console before Django reads it: a caller whose
credentials name no one may send 64 KiB, and every body has a deadline (the first
``CONSOLE_CLIENT_WAIT_S``, one second more for every 500 bytes received). Through the console's ASGI
application, with the messages a server would give it."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from django.conf import settings as django_settings
from django.test import Client
from rest_framework.authtoken.models import Token

from console.body_limit import ANONYMOUS_BODY_BYTES, BODY_MIN_RATE, BodySizeLimit
from tests.fixtures.asgi_calls import call, http_scope

pytestmark = pytest.mark.django_db(transaction=True)  # the gate reads the database from its own thread

A_FORM_ACCEPT = (b"accept", b"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")


def chunks(count: int, size: int = 16384) -> list[dict]:
    return [{"type": "http.request", "body": b"x" * size, "more_body": True} for _ in range(count)]


def bodies(received) -> int:
    """How many of the body's messages the app read (Django then waits for a disconnect)."""
    return sum(message["type"] == "http.request" for message in received)


def statuses(sent) -> list[int]:
    return [message["status"] for message in sent if message["type"] == "http.response.start"]


def session_cookie(user) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()


def test_an_anonymous_body_past_64_kib_is_refused_before_a_byte_is_read():
    # 300 unfinished 2.6 MB bodies to /login/ took the console from 376 to 962 MB.
    from console.asgi import application

    scope = http_scope("/login/", [(b"content-length", str(ANONYMOUS_BODY_BYTES + 1).encode()), (b"cookie", b"sessionid=madeup")])

    sent, received = asyncio.run(call(application, scope, chunks(10)))

    assert statuses(sent) == [413]
    assert json.loads(sent[1]["body"])["error"] == ("a request without a sign-in or a token may carry at most 65536 bytes: "
                                                    "sign in or send an API token; the body was not read")
    assert received == []


@pytest.mark.parametrize("authorization", [b"Token " + b"0" * 40, b"Bearer not-the-worker-token"])
def test_a_body_past_64_kib_with_a_token_that_names_no_one_is_401_naming_the_token(authorization):
    # A revoked token was told its body was too large: its client chased the size.
    from console.asgi import application

    scope = http_scope("/api/models/digits/release/", [(b"content-length", str(ANONYMOUS_BODY_BYTES + 1).encode()),
                                                       (b"authorization", authorization)])

    sent, received = asyncio.run(call(application, scope, chunks(10)))

    assert statuses(sent) == [401]
    assert json.loads(sent[1]["body"])["error"].startswith("the Authorization header names no one")
    assert received == []


def test_an_anonymous_browser_form_past_64_kib_gets_the_error_page_naming_the_sign_in():
    from console.asgi import application

    scope = http_scope("/login/", [(b"content-length", str(ANONYMOUS_BODY_BYTES + 1).encode()), A_FORM_ACCEPT])

    sent, _ = asyncio.run(call(application, scope, []))

    assert statuses(sent) == [413]
    assert "may carry at most 65536 bytes: sign in or send an API token" in sent[1]["body"].decode()


def test_an_anonymous_chunked_body_is_cut_off_at_64_kib():
    from console.asgi import application

    sent, received = asyncio.run(call(application, http_scope("/login/", [(b"transfer-encoding", b"chunked")]), chunks(200)))

    assert statuses(sent) == [413]
    assert len(received) == ANONYMOUS_BODY_BYTES // 16384 + 1  # nothing read past the chunk that crossed it


def test_an_anonymous_body_of_64_kib_is_read():
    from console.asgi import application

    scope = http_scope("/login/", [(b"content-length", str(ANONYMOUS_BODY_BYTES).encode())])

    sent, received = asyncio.run(call(application, scope, [*chunks(3), {"type": "http.request", "body": b"x" * 16384}], hang_after=4))

    assert bodies(received) == 4
    assert 413 not in statuses(sent)


@pytest.mark.parametrize("credential", ["session", "token"])
def test_a_signed_in_callers_body_may_reach_the_form_size(viewer, credential):
    from console.asgi import application

    header = session_cookie(viewer) if credential == "session" else (b"authorization", f"Token {Token.objects.create(user=viewer).key}".encode())
    size = 40 * 16384  # 640 KiB: past an anonymous caller's bound, under DATA_UPLOAD_MAX_MEMORY_SIZE
    scope = http_scope("/api/models/", [(b"content-length", str(size).encode()), (b"content-type", b"application/json"), header])

    sent, received = asyncio.run(call(application, scope, [*chunks(39), {"type": "http.request", "body": b"x" * 16384}], hang_after=40))

    assert bodies(received) == 40  # all of it read, and answered by the API (not JSON, or not the viewer's to make)
    assert statuses(sent)[0] in (400, 403)


def test_a_workers_report_past_64_kib_is_read():
    from console.asgi import application

    size = 10 * 16384
    scope = http_scope("/api/serving/reports", [(b"content-length", str(size).encode()), (b"content-type", b"application/json"),
                                                (b"authorization", f"Bearer {django_settings.SERVING_WORKER_TOKEN}".encode())])

    sent, received = asyncio.run(call(application, scope, [*chunks(9), {"type": "http.request", "body": b"x" * 16384}], hang_after=10))

    assert bodies(received) == 10
    assert statuses(sent) == [400]  # read whole, then refused as no JSON


def test_a_body_that_stops_arriving_is_408_within_the_client_wait_and_its_connection_closed(settings):
    from console.asgi import application

    settings.CONSOLE_CLIENT_WAIT_S = 1.0
    scope = http_scope("/login/", [(b"content-length", b"1000")])

    started = time.monotonic()
    sent, received = asyncio.run(call(application, scope, [{"type": "http.request", "body": b"x" * 10, "more_body": True}], hang_after=1))

    assert 1.0 <= time.monotonic() - started < 5
    assert statuses(sent) == [408]
    assert (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"] == ("the request body arrived slower than 500 bytes a second after its first 1 seconds "
                                                    "(CONSOLE_CLIENT_WAIT_S); the connection is closed")


def test_a_body_dripping_a_few_bytes_at_a_time_is_408_once_it_falls_behind_500_bytes_a_second(settings):
    # One byte every 10 s used to hold its connection, and its part of a body, for ever.
    from console.asgi import application

    settings.CONSOLE_CLIENT_WAIT_S = 1.0
    drip = [{"type": "http.request", "body": b"x" * 10, "more_body": True} for _ in range(30)]

    sent, received = asyncio.run(call(application, http_scope("/login/", [(b"content-length", b"1000")]), drip, pause_s=0.3))

    assert statuses(sent) == [408]
    assert len(received) < 6  # the deadline moved 0.02 s a chunk, the chunks came 0.3 s apart


def test_a_slow_body_that_keeps_500_bytes_a_second_is_read_whole(settings):
    from console.asgi import application

    settings.CONSOLE_CLIENT_WAIT_S = 1.0
    size = 6 * BODY_MIN_RATE * 2
    paced = [{"type": "http.request", "body": b"x" * (BODY_MIN_RATE * 2), "more_body": index < 5} for index in range(6)]

    sent, received = asyncio.run(call(application, http_scope("/login/", [(b"content-length", str(size).encode())]), paced, pause_s=0.5))

    assert len(received) == 6  # 3 s in all, three times the client wait
    assert 408 not in statuses(sent)


def test_an_answer_taking_longer_than_the_client_wait_is_not_cut_off(settings):
    # Once the body is in, the app's wait for a disconnect (Django's, while a view runs) has no deadline.
    settings.CONSOLE_CLIENT_WAIT_S = 1.0
    waited = []

    async def app(scope, receive, send):
        await receive()
        try:
            waited.append(await asyncio.wait_for(receive(), 1.5))
        except TimeoutError:
            waited.append("still waiting")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent, _ = asyncio.run(call(BodySizeLimit(app), http_scope("/login/", [(b"content-length", b"2")]),
                               [{"type": "http.request", "body": b"ok"}], hang_after=1))

    assert waited == ["still waiting"]
    assert statuses(sent) == [200]
