"""Browser-facing hardening: headers, cookies, a CSP with nothing inline on any page, the
websocket's Origin check, the schema for signed-in users only, and a refusal to start
outside debug with a weak secret key."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import connections
from django.test import Client

from tests.console.conftest import report_from

REPO_ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- headers and cookies


def test_pages_carry_the_content_security_policy(viewer_page, digits):
    policy = viewer_page.get("/models/digits/")["Content-Security-Policy"]

    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'"
    assert directives["img-src"] == "'self' data:"
    assert directives["connect-src"] == "'self' ws://testserver wss://testserver"
    assert directives["frame-ancestors"] == "'none'"
    assert directives["object-src"] == "'none'"
    assert directives["base-uri"] == "'self'"
    assert directives["form-action"] == "'self'"
    assert "unsafe" not in policy


def test_pages_forbid_framing_sniffing_and_foreign_referrers(client):
    response = client.get("/login/")

    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"


def test_https_answers_carry_hsts_outside_debug(client):
    assert client.get("/login/", secure=True)["Strict-Transport-Security"] == "max-age=31536000"


def test_session_and_csrf_cookies_are_secure_and_httponly(operator):
    client = Client()
    client.get("/login/", secure=True)

    response = client.post("/login/", {"username": "olivia", "password": "pw-olivia"}, secure=True)

    assert response.status_code == 302
    session = response.cookies[django_settings.SESSION_COOKIE_NAME]
    assert (bool(session["secure"]), bool(session["httponly"])) == (True, True)
    # The pages' scripts read the token from a meta tag, never the cookie: no script needs it.
    assert (bool(client.cookies["csrftoken"]["secure"]), bool(client.cookies["csrftoken"]["httponly"])) == (True, True)


def _settings_in_a_fresh_process(tmp_path, expression: str, **env) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "DJANGO_SECRET_KEY", "SECURE_COOKIES", "SECURE_HSTS_SECONDS", "DJANGO_DEBUG"}}
    environment.update({"DJANGO_SETTINGS_MODULE": "console.settings", "DATA_DIR": str(tmp_path / "data"), **env})
    script = f"import django; django.setup(); from django.conf import settings; print({expression})"
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=120)
    return result


def test_secure_cookies_can_be_turned_off_for_plain_http_and_are_off_in_debug(tmp_path):
    expression = "settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE, settings.SECURE_HSTS_SECONDS"

    assert _settings_in_a_fresh_process(tmp_path, expression).stdout.strip().splitlines()[-1] == "True True 31536000"
    assert _settings_in_a_fresh_process(tmp_path, expression, SECURE_COOKIES="false").stdout.strip().splitlines()[-1] == "False False 31536000"
    assert _settings_in_a_fresh_process(tmp_path, expression, DJANGO_DEBUG="true").stdout.strip().splitlines()[-1] == "False False 0"


# ---------------------------------------------------------------- the secret key


# An empty DJANGO_SECRET_KEY= means "not set" (the one rule of serving/env.py): the generated
# key is used then (tests/console/test_settings_env.py).
@pytest.mark.parametrize("key", ["change-me", "short-but-random-Zx81", "django-insecure-" + "k" * 20 + "0123456789abcdefghijklmnop", "change-me-" * 6])
def test_a_default_or_weak_secret_key_stops_the_process_outside_debug(tmp_path, key):
    result = _settings_in_a_fresh_process(tmp_path, "'started'", DJANGO_SECRET_KEY=key, DJANGO_DEBUG="false")

    assert result.returncode != 0
    assert "SettingError: DJANGO_SECRET_KEY is" in result.stderr
    assert "started" not in result.stdout


def test_manage_py_refuses_a_weak_secret_key_in_one_line(tmp_path):
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "DJANGO_DEBUG"}}
    environment.update({"DATA_DIR": str(tmp_path / "data"), "DJANGO_SECRET_KEY": "change-me", "DJANGO_DEBUG": "false"})

    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=120)

    assert result.returncode == 1
    assert result.stderr.startswith("manage.py: DJANGO_SECRET_KEY is only 9 characters long")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_long_random_secret_key_or_the_generated_one_starts(tmp_path):
    good = _settings_in_a_fresh_process(tmp_path, "'started'", DJANGO_SECRET_KEY="pX3v9-Qm2LzR7tYb0sWn4Hk8JcAe6GdUf1VrTy5NqMiOo_BlKx", DJANGO_DEBUG="false")
    generated = _settings_in_a_fresh_process(tmp_path, "'started'", DJANGO_DEBUG="false")

    assert (good.returncode, good.stdout.strip().splitlines()[-1]) == (0, "started")
    assert (generated.returncode, generated.stdout.strip().splitlines()[-1]) == (0, "started")


def test_debug_tolerates_a_placeholder_key(tmp_path):
    result = _settings_in_a_fresh_process(tmp_path, "'started'", DJANGO_SECRET_KEY="change-me", DJANGO_DEBUG="true")

    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- nothing inline


class InlineFinder(HTMLParser):
    """Scripts without src (except JSON data blocks), style attributes and elements,
    and on* handler attributes: everything the policy would block."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "script" and "src" not in attributes and attributes.get("type") != "application/json":
            self.found.append(f"inline <script> {attributes}")
        if tag == "style":
            self.found.append("<style> element")
        self.found += [f"{name}= on <{tag}>" for name in attributes if name == "style" or name.startswith("on")]


def inline_parts(html: str) -> list[str]:
    finder = InlineFinder()
    finder.feed(html)
    return finder.found


@pytest.mark.parametrize("path", ["/", "/models/digits/", "/models/digits/versions/2/", "/workers/", "/drills/", "/models/digits/rollback/", "/models/digits/?fragment=release-panel"])
def test_signed_in_pages_have_nothing_inline(operator_page, canary_digits, path):
    report_from("w-1", generation=2, versions=[{"model": "digits", "version": 1, "requests": 5, "errors": 0}])

    response = operator_page.get(path)

    assert response.status_code == 200
    assert inline_parts(response.content.decode()) == []


def test_the_sign_in_page_has_nothing_inline(client):
    assert inline_parts(client.get("/login/").content.decode()) == []


def test_the_split_bar_sizes_segments_with_classes(operator_page, canary_digits):
    html = operator_page.get("/models/digits/").content.decode()

    assert re.search(r'class="split-seg seg-stable vc-\d split-w-90"', html)
    assert re.search(r'class="split-seg seg-canary vc-\d split-w-10"', html)
    assert ".split-w-90 { flex-grow: 90; }" in (REPO_ROOT / "static/css/split.css").read_text()


# ---------------------------------------------------------------- password validators


@pytest.mark.parametrize(("password", "words"), [
    ("olivia2024", "too similar"),
    ("short7!", "too short"),
    ("password123", "too common"),
    ("8046297315", "entirely numeric"),
])
def test_passwords_are_checked_by_the_four_standard_validators(password, words):
    with pytest.raises(ValidationError) as refused:
        validate_password(password, user=User(username="olivia", email="olivia@example.com"))

    assert any(words in message for message in refused.value.messages)


# ---------------------------------------------------------------- the schema


def test_the_openapi_schema_needs_a_signed_in_user(client, operator_client):
    anonymous = client.get("/api/schema/", HTTP_ACCEPT="application/json")

    assert anonymous.status_code == 401
    assert anonymous.json() == {"error": "Authentication credentials were not provided."}
    assert operator_client.get("/api/schema/", HTTP_ACCEPT="application/json").status_code == 200


# ---------------------------------------------------------------- the live feed's Origin


def _session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{django_settings.SESSION_COOKIE_NAME}={client.cookies[django_settings.SESSION_COOKIE_NAME].value}".encode()


async def _connect(origin: bytes, cookie: bytes, path: str = "/ws/live/", host: bytes = b"testserver", **scope) -> bool:
    from console.asgi import application

    communicator = WebsocketCommunicator(application, path, headers=[(b"origin", origin), (b"cookie", cookie), (b"host", host)])
    communicator.scope.update(scope)
    connected, _ = await communicator.connect(timeout=5)
    await communicator.disconnect()
    return connected


@pytest.mark.parametrize("path", ["/ws/nope/", "/ws/" + "x" * 8000, "/"])
def test_a_websocket_to_any_other_path_is_refused_without_an_error(caplog, path):
    assert asyncio.run(_connect(b"http://testserver", b"", path)) is False
    assert [record for record in caplog.records if record.levelno >= logging.ERROR] == []


@pytest.mark.django_db(transaction=True)
def test_the_live_feed_refuses_a_foreign_origin_and_accepts_its_own(settings, operator):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    cookie = _session_cookie(operator)

    assert asyncio.run(_connect(b"http://evil.example", cookie)) is False
    assert asyncio.run(_connect(b"http://testserver", cookie)) is True


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("origin", [b"http://testserver:3000", b"https://testserver", b"http://localhost:8888", b"http://localhost",
                                    b"null", b"http://testserver:notaport"])
def test_the_live_feed_refuses_another_port_scheme_or_allowed_host_of_the_same_machine(settings, operator, origin):
    # Channels' own validator compared hosts only: a page of Grafana or a dev server on the
    # same host opened the feed with the signed-in user's cookies.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

    assert asyncio.run(_connect(origin, _session_cookie(operator))) is False


@pytest.mark.django_db(transaction=True)
def test_the_live_feed_accepts_its_own_origin_on_any_port_and_a_trusted_one(settings, operator):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CSRF_TRUSTED_ORIGINS = ["https://localhost:9443"]  # e.g. a TLS proxy's address (its host is in ALLOWED_HOSTS)
    cookie = _session_cookie(operator)

    assert asyncio.run(_connect(b"http://testserver:8000", cookie, host=b"testserver:8000")) is True
    assert asyncio.run(_connect(b"https://testserver", cookie, scheme="wss")) is True
    assert asyncio.run(_connect(b"https://localhost:9443", cookie)) is True


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("change", "close_code"), [("deactivated", 4401), ("signed out elsewhere", 4401), ("database unreachable", 1013)])
def test_an_open_live_feed_stops_once_its_user_may_no_longer_read_it(settings, operator, monkeypatch, change, close_code):
    # Checked at the handshake alone, a deactivated user's open feed went on (12 messages in 10 s).
    # With the database gone the check cannot answer: "try again later", never an error.
    from channels.layers import get_channel_layer
    from django.contrib.sessions.models import Session

    from console import consumers
    from console.asgi import application
    from registry.fleet.live import LIVE_GROUP
    from tests.console.test_outage import unreachable_database

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    monkeypatch.setattr(consumers, "SIGN_IN_RECHECK_S", 0.0)
    headers = [(b"origin", b"http://testserver"), (b"cookie", _session_cookie(operator)), (b"host", b"testserver")]
    communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
    loop = asyncio.new_event_loop()  # one loop for the socket; the database is changed between its turns, from this thread
    try:
        assert loop.run_until_complete(communicator.connect(timeout=5))[0]
        loop.run_until_complete(get_channel_layer().group_send(LIVE_GROUP, {"type": "live.report", "worker": "w1"}))
        assert loop.run_until_complete(communicator.receive_json_from(timeout=5))["worker"] == "w1"
        with contextlib.ExitStack() as outage:
            if change == "deactivated":
                User.objects.filter(pk=operator.pk).update(is_active=False)
            elif change == "signed out elsewhere":
                Session.objects.all().delete()
            else:
                outage.enter_context(unreachable_database())
            loop.run_until_complete(get_channel_layer().group_send(LIVE_GROUP, {"type": "live.report", "worker": "w2"}))

            closed = loop.run_until_complete(communicator.receive_output(timeout=5))
            loop.run_until_complete(communicator.wait())
    finally:
        # The consumer's check ran in asgiref's shared thread: close its connection while
        # this test may still use the database (a later test without it would trip on it).
        loop.run_until_complete(database_sync_to_async(connections.close_all)())
        loop.close()

    assert closed == {"type": "websocket.close", "code": close_code}


@pytest.mark.django_db(transaction=True)
def test_while_redis_is_down_the_live_feed_is_refused_try_again_later_without_an_error(settings, operator, caplog):
    from console import redis_options

    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed again below: connections to it are refused
    settings.CHANNEL_LAYERS = redis_options.channel_layers(f"redis://127.0.0.1:{port}/0", "down-test")
    headers = [(b"origin", b"http://testserver"), (b"cookie", _session_cookie(operator)), (b"host", b"testserver")]

    async def handshake():
        from console.asgi import application

        communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
        try:
            answer = await communicator.connect(timeout=10)
            await communicator.wait(timeout=5)
        finally:  # the session was read in asgiref's thread: its connection must not outlive the test
            await database_sync_to_async(connections.close_all)()
        return answer

    assert asyncio.run(handshake()) == (False, 1013)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


def test_celery_takes_json_messages_only_never_pickle():
    from console.celery import app

    assert app.conf.accept_content == ["json"] and app.conf.task_serializer == "json"


def test_a_client_that_went_away_is_not_taken_for_an_outage_but_redis_refusing_is():
    from redis.exceptions import ConnectionError as RedisConnectionError
    from uvicorn.protocols.utils import ClientDisconnected

    from console.socket_outage import database_error_in

    assert database_error_in(ClientDisconnected()) is None  # an OSError: a page closed, nothing down
    assert database_error_in(FileNotFoundError()) is None
    assert isinstance(database_error_in(RedisConnectionError("Error 111 connecting")), RedisConnectionError)
