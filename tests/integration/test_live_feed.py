"""Worker reports reach browsers over /ws/live/ through the real Redis channel layer."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import connections
from rest_framework.test import APIClient

from console.consumers import LiveConsumer
from registry.models import VersionMetricMinute
from serving.contract import CONTRACT_VERSION
from tests.fixtures.minutes import clear_of_a_minute_turn

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

REPORT = {
    "worker": {"id": "w-1", "host": "h", "pid": 1, "url": "", "device": "cpu"},
    "generation": 1,
    "loaded": [{"model": "tiny", "version": 1, "routed": True, "ready": True}],
    "versions": [{"model": "tiny", "version": 1, "requests": 42, "errors": 1, "latency_sum_s": 0.2,
                  "latency_buckets": {"0.001": 40, "+Inf": 42}, "batch_size_buckets": {"1": 10, "+Inf": 12}, "p50_ms": 1.0, "p99_ms": 8.0}],
    "contract": CONTRACT_VERSION,
}


@pytest.fixture(autouse=True)
async def close_sync_thread_connections():
    """sync_to_async runs ORM calls on a worker thread whose connection would outlive
    the test and stop pytest-django from dropping the test database."""
    yield
    await sync_to_async(connections.close_all)()


def post_report(report: dict) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {settings.SERVING_WORKER_TOKEN}")
    return client.post("/api/serving/reports", report, format="json").status_code


async def connect(user):
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = user
    connected, code = await communicator.connect()
    return communicator, connected, code


async def test_signed_in_browser_receives_worker_reports(operator):
    assert "Redis" in settings.CHANNEL_LAYERS["default"]["BACKEND"]
    communicator, connected, _ = await connect(operator)
    assert connected

    assert await sync_to_async(post_report)(REPORT) == 204
    message = await communicator.receive_json_from(timeout=5)

    assert message["kind"] == "report"
    assert message["worker"] == "w-1"
    assert message["versions"][0]["requests"] == 42
    await communicator.disconnect()


async def test_anonymous_browser_is_refused():
    communicator, connected, code = await connect(AnonymousUser())

    assert not connected
    assert code == 4401


async def test_reports_roll_up_per_version_and_minute(three_versions_async):
    report = {**REPORT, "versions": [{**REPORT["versions"][0], "model": "digits"}]}
    clear_of_a_minute_turn()  # both reports in one minute's row

    await sync_to_async(post_report)(report)
    await sync_to_async(post_report)(report)

    row = await VersionMetricMinute.objects.select_related("version").aget()
    assert (row.version.number, row.requests, row.errors) == (1, 84, 2)
    assert row.latency_buckets == {"0.001": 80, "+Inf": 84}


@pytest.fixture
def three_versions_async(transactional_db):
    from registry.models import ModelVersion, RegisteredModel

    model = RegisteredModel.objects.create(name="digits")
    ModelVersion.objects.create(model=model, number=1, sha256="0" * 64, size_bytes=1, status="ready")
    return model


async def test_a_report_s_digest_reaches_browsers_and_a_report_with_a_malformed_one_reaches_nothing(operator):
    """The drill's progress compares the digests a browser is sent: only a digest the
    report contract accepted (64 lowercase hex) is ever relayed."""
    communicator, connected, _ = await connect(operator)
    assert connected

    assert await sync_to_async(post_report)({**REPORT, "digest": "<img src=x onerror=alert(1)>"}) == 400
    assert await communicator.receive_nothing(timeout=1)
    assert await sync_to_async(post_report)({**REPORT, "digest": "ab" * 32}) == 204
    message = await communicator.receive_json_from(timeout=5)

    assert message["kind"] == "report" and message["digest"] == "ab" * 32
    await communicator.disconnect()


async def test_a_state_message_the_console_did_not_sign_reaches_no_browser(operator):
    """Anything that reaches Redis can publish to the serving group; the feed relays only
    a desired state signed with the console's key, with its digest."""
    from channels.layers import get_channel_layer

    from registry.fleet.push_key import console_push_key
    from serving.contract import APPLY_MESSAGE, SERVING_GROUP
    from serving.state_signing import push_signing_key, sign_push, sign_state, signing_key

    communicator, connected, _ = await connect(operator)
    assert connected
    layer = get_channel_layer()
    state = {"generation": 7, "models": {}, "epoch": "epoch-x", "contract": CONTRACT_VERSION}
    signed = sign_push(state, console_push_key())

    for forged in ({**state, "digest": "not hex"}, {**state, "digest": signed["digest"]}, sign_push(state, push_signing_key("another-secret")),
                   sign_state(state, signing_key(settings.SERVING_WORKER_TOKEN)), {**signed, "generation": 8}):
        await layer.group_send(SERVING_GROUP, {"type": APPLY_MESSAGE, "state": forged})
    assert await communicator.receive_nothing(timeout=1)
    await layer.group_send(SERVING_GROUP, {"type": APPLY_MESSAGE, "state": signed})
    message = await communicator.receive_json_from(timeout=5)

    assert message == {"kind": "state", "generation": 7, "digest": signed["digest"], "models": {}}
    await communicator.disconnect()
