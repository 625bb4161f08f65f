"""While the database cannot be reached the console answers 503 with ``Retry-After``
(JSON under /api/, a page elsewhere), its error pages still render, and readiness names
the dependency that failed. The failure is the driver's own: the connection is pointed
where no database answers (a missing directory for SQLite, a closed port for PostgreSQL).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.auth.models import User
from django.contrib.sessions.middleware import SessionMiddleware
from django.db import OperationalError, connection
from django.test import Client, RequestFactory
from rest_framework.authtoken.models import Token

from console import views
from tests.console.conftest import signed_in
from tools.stack import free_port

pytestmark = pytest.mark.django_db(transaction=True)  # the test closes and reopens the connection


@contextmanager
def unreachable_database() -> Iterator[None]:
    original = dict(connection.settings_dict)
    connection.close()
    if connection.vendor == "sqlite":
        connection.settings_dict["NAME"] = "/nonexistent-outage-test/db.sqlite3"
    else:
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(free_port()))
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(original)


def signed_in_request(user: User, path: str):
    """A request as Django's session and authentication middleware leave it: the user
    is loaded from the session table only when something reads it."""
    session_key = signed_in(user).cookies["sessionid"].value
    request = RequestFactory().get(path, HTTP_COOKIE=f"sessionid={session_key}")
    SessionMiddleware(lambda request: None).process_request(request)
    AuthenticationMiddleware(lambda request: None).process_request(request)
    return request


def test_api_answers_503_with_retry_after_while_the_database_is_unreachable(operator_client):
    with unreachable_database():
        response = operator_client.get("/api/models/")

    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "5"
    assert response.json()["error"] == "the database is unavailable; retry in 5 s"
    assert len(response.json()["request_id"]) == 32


def test_api_answers_again_once_the_database_returns(operator_client):
    with unreachable_database():
        operator_client.get("/api/models/")

    assert operator_client.get("/api/models/").status_code == 200


def test_signed_in_page_answers_the_outage_page_while_the_database_is_unreachable(operator):
    page = signed_in(operator)

    with unreachable_database():
        response = page.get("/")

    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    assert response["Retry-After"] == "5"
    assert b"The database is unavailable" in response.content


def test_not_found_page_renders_for_a_signed_in_user_without_the_database(operator):
    page = signed_in(operator)

    with unreachable_database():
        response = page.get("/no-such-page/")

    assert response.status_code == 404
    assert b"Not found" in response.content


def test_server_error_page_renders_for_a_signed_in_user_without_the_database(operator):
    request = signed_in_request(operator, "/models/")

    with unreachable_database():
        response = views.server_error(request)

    assert response.status_code == 500
    assert b"Something went wrong" in response.content


def test_database_error_raised_outside_a_view_is_a_503_not_a_500(operator):
    """handler500 answers errors raised inside middleware (a session save, say)."""
    request = signed_in_request(operator, "/models/")

    with unreachable_database():
        try:
            User.objects.count()
        except OperationalError:
            response = views.server_error(request)

    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert b"The database is unavailable" in response.content


def test_an_upload_sized_body_is_a_503_before_it_is_read_while_the_database_is_unreachable(operator):
    """The upload gate in front of Django reads the database to know who is asking."""
    from console.asgi import application

    token = Token.objects.create(user=operator).key
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/api/models/digits/versions/", "raw_path": b"/api/models/digits/versions/", "query_string": b"",
             "root_path": "", "headers": [(b"content-length", b"1000000000"), (b"authorization", f"Token {token}".encode())],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    sent, received = [], []

    async def receive():
        received.append(True)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    with unreachable_database():
        asyncio.run(asyncio.wait_for(application(scope, receive, send), timeout=20))

    assert sent[0]["status"] == 503
    assert (b"retry-after", b"5") in sent[0]["headers"]
    assert b"the database is unavailable" in sent[1]["body"]
    assert received == []


def test_healthz_answers_ok_while_the_database_is_unreachable(client):
    with unreachable_database():
        response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_ready_when_the_database_and_redis_answer(client):
    response = client.get("/readyz")

    assert response.status_code == 200
    assert response.json() == {"ready": True, "database": {"ok": True}, "redis": {"ok": True}}


def test_readyz_names_the_database_when_it_is_unreachable(client):
    with unreachable_database():
        response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json() == {"ready": False, "database": {"ok": False, "error": "cannot connect or query (OperationalError)"}, "redis": {"ok": True}}


def test_readyz_names_redis_when_it_is_unreachable(client, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"

    response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json() == {"ready": False, "database": {"ok": True}, "redis": {"ok": False, "error": "cannot connect or ping (ConnectionError)"}}


def test_readyz_not_ready_without_the_database_says_when_to_retry(client):
    with unreachable_database():
        response = client.get("/readyz")

    assert response.status_code == 503
    assert response["Retry-After"] == "5"


def test_readyz_not_ready_without_redis_says_when_to_retry(client, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"

    response = client.get("/readyz")

    assert response.status_code == 503
    assert response["Retry-After"] == "5"


# ---- a database that answers but takes no writes (a hot standby, writes switched off) ---


@pytest.fixture
def read_only_database():
    """Writes on this test's connection are refused as on a standby: PostgreSQL's
    default_transaction_read_only, SQLite's query_only (the suite runs on either)."""
    if connection.vendor == "postgresql":
        on, off = "SET SESSION default_transaction_read_only = on", "SET SESSION default_transaction_read_only = off"
    else:
        on, off = "PRAGMA query_only = ON", "PRAGMA query_only = OFF"
    with connection.cursor() as cursor:
        cursor.execute(on)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(off)


def test_a_change_on_a_read_only_database_is_a_503_that_says_so(operator_client, read_only_database):
    response = operator_client.post("/api/models/", {"name": "fraud"}, format="json")

    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json()["error"] == "the database accepts no writes now (read-only); retry in 5 s"


def test_a_worker_report_on_a_read_only_database_is_a_503(client, settings, read_only_database):
    from serving.contract import CONTRACT_VERSION

    report = {"worker": {"id": "w-1", "host": "box"}, "generation": None, "contract": CONTRACT_VERSION}
    response = client.post("/api/serving/reports", report, content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {settings.SERVING_WORKER_TOKEN}")

    assert response.status_code == 503


def test_signing_in_on_a_read_only_database_is_a_503_page_not_a_500(client, operator, read_only_database):
    operator.set_password("pw-read-only")
    response = client.post("/login/", {"username": operator.username, "password": "pw-read-only"})

    assert response.status_code == 503
    assert "The database accepts no writes" in response.content.decode()


@pytest.fixture
def browser(operator) -> Client:
    """Signed in; what a browser gets back, handler500's answers included (the test client
    would raise the error those answer instead)."""
    client = Client(raise_request_exception=False)
    client.force_login(operator)
    return client


def test_a_form_post_on_a_read_only_database_is_a_503_not_a_400_blaming_the_session(browser, digits, read_only_database):
    response = browser.post("/models/digits/rollback/", {"reason": "drill"})

    assert response.status_code == 503
    assert "The database accepts no writes" in response.content.decode()


def test_readyz_names_a_read_only_database(client, postgres_cluster, monkeypatch):
    """A standby is PostgreSQL's: readiness asks a cluster of the test's own, every new
    session of which is read-only, as after a failover."""
    import psycopg
    from django.db import DEFAULT_DB_ALIAS, connections

    server = postgres_cluster.settings_dict
    with psycopg.connect(host=server["HOST"], port=server["PORT"], user=server["USER"], dbname=server["NAME"], autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        admin.execute("SELECT pg_reload_conf()")
    standby = connections.configure_settings({DEFAULT_DB_ALIAS: dict(server)})[DEFAULT_DB_ALIAS]
    monkeypatch.setitem(connections.settings, DEFAULT_DB_ALIAS, standby)  # what readiness's new connection reads

    response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json()["database"] == {"ok": False, "error": "read-only: it accepts no writes"}


# ---- the live feed's websocket, whose handshake reads the session and the user ---------


def _live_feed_handshake(operator, extensions: dict) -> list[dict]:
    from console.asgi import application

    cookie = f"sessionid={signed_in(operator).cookies['sessionid'].value}".encode()
    scope = {"type": "websocket", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "ws", "path": "/ws/live/",
             "raw_path": b"/ws/live/", "query_string": b"", "root_path": "", "subprotocols": [], "extensions": extensions,
             "headers": [(b"host", b"testserver"), (b"origin", b"http://testserver"), (b"cookie", cookie)],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    sent = []

    async def receive():
        return {"type": "websocket.connect"}

    async def send(message):
        sent.append(message)

    with unreachable_database():
        asyncio.run(asyncio.wait_for(application(scope, receive, send), timeout=20))
    return sent


def test_the_live_feed_handshake_is_a_503_with_retry_after_while_the_database_is_unreachable(operator, caplog):
    sent = _live_feed_handshake(operator, {"websocket.http.response": {}})

    assert sent[0]["type"] == "websocket.http.response.start"
    assert sent[0]["status"] == 503
    assert (b"retry-after", b"5") in sent[0]["headers"]
    assert sent[1]["body"] == b"the database is unavailable; retry in 5 s"
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
    assert not any(record.exc_info for record in caplog.records)


def test_the_live_feed_handshake_is_closed_try_again_later_where_the_server_has_no_denial_responses(operator):
    sent = _live_feed_handshake(operator, {})

    assert sent == [{"type": "websocket.close", "code": 1013}]
