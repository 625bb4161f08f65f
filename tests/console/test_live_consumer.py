"""The browser feed relays desired-state changes with routes and the state's digest only;
a Redis that takes connections and never answers (a stopped process) holds neither its
handshake nor its close past the channel layer's send bound, and an open feed whose Redis
stops so is closed with 1013 (its own ping through the layer fails) instead of staying
silent while the page believes it live."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.db import connections
from django.test import Client

from console import consumers, redis_options
from console.consumers import state_change
from registry.actions import users
from registry.fleet.live import LIVE_GROUP
from serving.contract import DesiredState, ModelState, Route
from serving.state_signing import model_digests

SLACK_S = 3.0  # the test's own overhead on a loaded 2-core machine


def test_state_change_keeps_routes_generations_and_the_digests_only():
    state = DesiredState(generation=7, models={"digits": ModelState(generation=7, routes=(
        Route(version=1, weight=90, sha256="ab" * 32, artifact_url="/api/x"),
        Route(version=2, weight=10, sha256="cd" * 32, artifact_url="/api/y"),
    ))}, digest="ef" * 32)

    routes = [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
    assert state_change(state) == {"kind": "state", "generation": 7, "digest": "ef" * 32,
                                   "models": {"digits": {"generation": 7, "digest": model_digests(state)["digits"], "routes": routes}}}


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
    assert consumers.FEEDS.by_user.get(operator.pk) is None  # the refused handshake gave its place back


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


# ---------------------------------------------------------------- an open feed's watchdog

PING_EVERY_S = 1.0  # a fifth of the console's: quick, and still far above a loaded event loop's stalls
CLOSE_TRY_AGAIN = {"type": "websocket.close", "code": 1013}


@pytest.fixture
def quick_pings(monkeypatch):
    monkeypatch.setattr(consumers, "FEED_PING_EVERY_S", PING_EVERY_S)


@pytest.fixture(params=["redis", "in-memory"])
def healthy_layer(request, settings):
    """The console's layer (Redis) and the one-process one (tests, manage.py shell)."""
    if request.param == "redis":
        settings.CHANNEL_LAYERS = redis_options.channel_layers(request.getfixturevalue("redis_server").url, "healthy-feed-test")
    else:
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


class DeafLayer(InMemoryChannelLayer):
    """Sends go through; the feed's receive never returns, as on a connection that hung
    alone while the layer's other connections still work."""

    async def receive(self, channel):
        await asyncio.Event().wait()


class PingLosingLayer(InMemoryChannelLayer):
    """Loses the feed's pings and delivers everything else: the watchdog closes the feed
    while group messages still reach it."""

    async def send(self, channel, message):
        if message.get("type") != consumers.FEED_PING:
            await super().send(channel, message)


def watchdogs() -> list[asyncio.Task]:
    return [task for task in asyncio.all_tasks() if task.get_name() == consumers.WATCHDOG_TASK]


async def first_output_or_none(communicator: WebsocketCommunicator, timeout: float) -> dict | None:
    try:
        return await communicator.receive_output(timeout=timeout)
    except TimeoutError:
        return None  # nothing came: the communicator has cancelled the feed


async def end(communicator: WebsocketCommunicator) -> None:
    """The browser goes (the feed's discards may each wait out the send bound), then the
    session's thread connection is closed."""
    try:
        if not communicator.future.done():
            await communicator.disconnect(timeout=2 * django_settings.CHANNEL_SEND_TIMEOUT_S + SLACK_S)
    finally:
        await close_thread_connections()


def with_open_feed(communicator: WebsocketCommunicator, then, after=lambda: None):
    """(what ``then()`` returns, run once the feed is open; what ``after()`` returns, once the
    feed has ended, on the same event loop); the feed ends whatever happened."""
    async def run():
        try:
            connected, _ = await communicator.connect(timeout=5)
            assert connected
            result = await then()
        finally:
            await end(communicator)
        return result, after()

    return asyncio.run(run())


@pytest.mark.django_db(transaction=True)
def test_an_open_live_feed_is_closed_try_again_later_once_redis_stops_answering(operator, redis_layer, quick_pings):
    communicator = feed(operator)
    bound_s = consumers.FEED_PINGS_MISSED * PING_EVERY_S + django_settings.CHANNEL_SEND_TIMEOUT_S + SLACK_S

    async def freeze_and_wait():
        redis_layer()
        started = time.monotonic()
        return await first_output_or_none(communicator, bound_s), time.monotonic() - started

    (output, waited_s), _ = with_open_feed(communicator, freeze_and_wait)

    assert output == CLOSE_TRY_AGAIN
    assert waited_s < bound_s


@pytest.mark.django_db(transaction=True)
def test_an_open_live_feed_whose_pings_never_come_back_is_closed_try_again_later(operator, settings, quick_pings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.DeafLayer"}}
    communicator = feed(operator)
    bound_s = (consumers.FEED_PINGS_MISSED + 1) * PING_EVERY_S + SLACK_S

    async def wait():
        started = time.monotonic()
        return await first_output_or_none(communicator, bound_s), time.monotonic() - started

    (output, waited_s), _ = with_open_feed(communicator, wait)

    assert output == CLOSE_TRY_AGAIN
    assert waited_s < bound_s


@pytest.mark.django_db(transaction=True)
def test_a_healthy_live_feed_stays_open_past_several_pings_sends_none_and_leaves_no_watchdog(operator, healthy_layer, quick_pings):
    communicator = feed(operator)

    async def watch():
        running = len(watchdogs())
        quiet = await communicator.receive_nothing(timeout=4 * PING_EVERY_S)
        await get_channel_layer().group_send(LIVE_GROUP, {"type": "live.job", "job": {"id": 7}})
        return running, quiet, await communicator.receive_json_from(timeout=5)

    (running, quiet, relayed), left = with_open_feed(communicator, watch, after=lambda: len(watchdogs()))

    assert running == 1
    assert quiet is True  # no ping reached the browser, and the feed was not closed
    assert relayed == {"kind": "job", "job": {"id": 7}}
    assert left == 0


@pytest.mark.django_db(transaction=True)
def test_a_live_feed_closed_by_its_watchdog_sends_nothing_after_its_close(operator, settings, quick_pings):
    # uvicorn raises on a send after a close: a traceback per feed the watchdog closed
    # while group messages still arrived.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.PingLosingLayer"}}
    communicator = feed(operator)
    bound_s = (consumers.FEED_PINGS_MISSED + 1) * PING_EVERY_S + SLACK_S

    async def close_then_relay():
        closed = await first_output_or_none(communicator, bound_s)
        await get_channel_layer().group_send(LIVE_GROUP, {"type": "live.job", "job": {"id": 7}})
        return closed, await communicator.receive_nothing(timeout=1)

    (closed, nothing_after), _ = with_open_feed(communicator, close_then_relay)

    assert closed == CLOSE_TRY_AGAIN
    assert nothing_after is True


# ---------------------------------------------------------------- what a client sends

MIB = 1 << 20


@pytest.fixture
def decoded(monkeypatch) -> list[int]:
    """The length of every text the feed hands to its JSON decoder."""
    calls: list[int] = []
    decode = consumers.LiveConsumer.decode_json

    async def counting(cls, text_data):
        calls.append(len(text_data))
        return await decode(text_data)

    monkeypatch.setattr(consumers.LiveConsumer, "decode_json", classmethod(counting))
    return calls


@pytest.mark.django_db(transaction=True)
def test_a_live_feed_drops_a_clients_frames_unread_and_stays_open(operator, settings, decoded, caplog):
    # AsyncJsonWebsocketConsumer decoded each frame's JSON on the event loop: two sockets
    # sending 16 MiB arrays held a light API request for seconds. The feed takes nothing
    # from the page: a frame, JSON or not, text or bytes, is dropped without a decode.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    communicator = feed(operator)

    async def send_frames_then_relay():
        await communicator.send_to(text_data="[" + "1," * (MIB // 2 - 1) + "1]")  # a 1 MiB JSON array
        await communicator.send_to(text_data="{" * MIB)  # 1 MiB of invalid JSON
        await communicator.send_to(bytes_data=b"\x00" * MIB)
        quiet = await communicator.receive_nothing(timeout=1)
        await get_channel_layer().group_send(LIVE_GROUP, {"type": "live.job", "job": {"id": 7}})
        return quiet, await communicator.receive_json_from(timeout=5)

    (quiet, relayed), _ = with_open_feed(communicator, send_frames_then_relay)

    assert decoded == []
    assert quiet is True  # nothing answered, and the feed was not closed
    assert relayed == {"kind": "job", "job": {"id": 7}}
    assert [record.getMessage() for record in caplog.records if record.levelname in {"ERROR", "CRITICAL"}] == []


# ---------------------------------------------------------------- how many feeds are open


async def answer(communicator: WebsocketCommunicator):
    """"open", or how the feed was refused: ("handshake", code) before it was accepted (the
    client sees an HTTP 403), ("closed", code) after."""
    connected, code = await communicator.connect(timeout=5)
    if not connected:
        return "handshake", code
    if await communicator.receive_nothing(timeout=0.3):
        return "open"
    return "closed", (await communicator.receive_output(timeout=1)).get("code")


def open_feeds(communicators: list[WebsocketCommunicator], then):
    """Connect each in turn (their answers), run ``then()``, and end every one."""
    async def run():
        answers = []
        try:
            for communicator in communicators:
                answers.append(await answer(communicator))
            return answers, await then()
        finally:
            for communicator in communicators:
                await end(communicator)

    return asyncio.run(run())


async def nothing():
    return None


@pytest.mark.django_db(transaction=True)
def test_a_user_s_feeds_past_the_per_user_limit_are_refused_try_again_later_and_another_user_s_are_not(operator, viewer, settings):
    # One viewer's 2,000 feeds took a core and had the watchdog close every other user's.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.LIVE_FEEDS_PER_USER = 2

    answers, _ = open_feeds([feed(viewer), feed(viewer), feed(viewer), feed(operator)], nothing)

    # Closed 1013 once accepted: refused at the handshake, a browser saw the 403 a foreign Origin gets.
    assert answers == ["open", "open", ("closed", 1013), "open"]


@pytest.mark.django_db(transaction=True)
def test_a_closed_feed_gives_its_place_back(viewer, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.LIVE_FEEDS_PER_USER = 1

    first, _ = open_feeds([feed(viewer)], nothing)
    again, _ = open_feeds([feed(viewer)], nothing)

    assert (first, again, consumers.FEEDS.by_user.get(viewer.pk)) == (["open"], ["open"], None)


@pytest.mark.django_db(transaction=True)
def test_feeds_past_the_process_limit_are_refused_whoever_opens_them(operator, viewer, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.LIVE_FEEDS_MAX = 2

    answers, _ = open_feeds([feed(viewer), feed(operator), feed(operator)], nothing)

    assert answers == ["open", "open", ("closed", 1013)]


@pytest.mark.django_db(transaction=True)
def test_a_user_who_must_still_choose_a_password_gets_no_live_feed(viewer, operator, settings):
    """A one-time password opens only the password change: the feed streamed every
    worker's report before the password was chosen."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    users.reset_password(viewer, operator)

    answers, _ = open_feeds([feed(viewer), feed(operator)], nothing)

    assert answers == [("handshake", 4401), "open"]
