"""The browser feed relays desired-state changes with routes and the state's digest only;
a Redis that takes connections and never answers (a stopped process) holds neither its
handshake nor its close past the channel layer's send bound."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.db import connections
from django.test import Client

from console import redis_options
from console.consumers import state_change
from serving.contract import DesiredState, ModelState, Route

SLACK_S = 3.0  # the test's own overhead on a loaded 2-core machine


def test_state_change_keeps_routes_generations_and_the_digest_only():
    state = DesiredState(generation=7, models={"digits": ModelState(generation=7, routes=(
        Route(version=1, weight=90, sha256="ab" * 32, artifact_url="/api/x"),
        Route(version=2, weight=10, sha256="cd" * 32, artifact_url="/api/y"),
    ))}, digest="ef" * 32)

    assert state_change(state) == {"kind": "state", "generation": 7, "digest": "ef" * 32,
                                   "models": {"digits": {"generation": 7, "routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}}}


# ---------------------------------------------------------------- a frozen Redis


@pytest.fixture
def redis_layer(settings, redis_server):
    """The channel layer on a Redis of this test's own; ``freeze`` stops the process
    (SIGSTOP: the kernel still completes connections, nothing answers), and the teardown
    lets it go on, so the fixture can stop it."""
    settings.CHANNEL_LAYERS = redis_options.channel_layers(redis_server.url, "frozen-feed-test")
    frozen = []

    def freeze():
        os.kill(redis_server.process.pid, signal.SIGSTOP)
        frozen.append(True)

    yield freeze
    if frozen:
        os.kill(redis_server.process.pid, signal.SIGCONT)


def feed(user) -> WebsocketCommunicator:
    """/ws/live/ through the console's whole websocket stack, signed in as ``user``."""
    from console.asgi import application

    client = Client()
    client.force_login(user)
    cookie = f"{django_settings.SESSION_COOKIE_NAME}={client.cookies[django_settings.SESSION_COOKIE_NAME].value}".encode()
    return WebsocketCommunicator(application, "/ws/live/", headers=[(b"origin", b"http://testserver"), (b"cookie", cookie),
                                                                   (b"host", b"testserver")])


async def close_thread_connections():
    # The session was read in asgiref's thread: its connection must not outlive the test.
    await database_sync_to_async(connections.close_all)()


@pytest.mark.django_db(transaction=True)
def test_while_redis_never_answers_the_live_feed_is_refused_try_again_later_within_the_send_bound(operator, redis_layer):
    communicator = feed(operator)
    redis_layer()

    async def handshake():
        try:
            return await communicator.connect(timeout=django_settings.CHANNEL_SEND_TIMEOUT_S + SLACK_S)
        finally:
            await close_thread_connections()

    started = time.monotonic()
    answer = asyncio.run(handshake())

    assert answer == (False, 1013)
    assert time.monotonic() - started < django_settings.CHANNEL_SEND_TIMEOUT_S + SLACK_S


@pytest.mark.django_db(transaction=True)
def test_a_live_feed_closed_while_redis_never_answers_ends_within_the_send_bound(operator, redis_layer):
    communicator = feed(operator)

    async def open_freeze_close():
        try:
            connected, _ = await communicator.connect(timeout=5)
            assert connected
            redis_layer()
            started = time.monotonic()
            await communicator.disconnect(timeout=django_settings.CHANNEL_SEND_TIMEOUT_S + SLACK_S)
            return time.monotonic() - started
        finally:
            await close_thread_connections()

    assert asyncio.run(open_freeze_close()) < django_settings.CHANNEL_SEND_TIMEOUT_S + SLACK_S
