"""A live feed open while Redis loses its data (FLUSHALL, a failover to an empty replica,
an eviction) goes on receiving reports. The flush dropped the feed's group memberships
and no connection: its own pings (sent to its channel, not a group) still came back, so
the feed stayed open and silent, and the page showed "Live" over workers and drills that
no longer moved until it was reloaded. The Redis is this test's own (``redis_server``)."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.db import connections

from console import consumers, redis_options
from console.consumers import LiveConsumer

from .test_live_feed import REPORT, post_report

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def own_layer(settings, redis_server):
    settings.CHANNEL_LAYERS = redis_options.channel_layers(redis_server.url, settings.CHANNEL_LAYER_PREFIX)
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


async def test_a_live_feed_still_receives_reports_after_redis_lost_its_data(operator, own_layer, redis_server, monkeypatch):
    monkeypatch.setattr(consumers, "FEED_PING_EVERY_S", 1.0)
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = operator
    connected, _ = await communicator.connect()
    assert connected
    try:
        assert await sync_to_async(post_report)(REPORT) == 204
        assert (await communicator.receive_json_from(timeout=5))["kind"] == "report"

        await asyncio.to_thread(subprocess.run, ["redis-cli", "-p", str(redis_server.port), "FLUSHALL"], check=True, capture_output=True, timeout=10)
        await asyncio.sleep(3.0)  # a few pings

        assert await sync_to_async(post_report)(REPORT) == 204
        message = await communicator.receive_json_from(timeout=5)  # TimeoutError before: the report went to no one
        assert message["kind"] == "report"
        assert message["worker"] == "w-1"
    finally:
        await communicator.disconnect()
        await sync_to_async(connections.close_all)()
