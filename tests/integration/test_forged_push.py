"""Anything that can publish on Redis can put a state on group ``serving``: a live worker
uses only what the console signed, and never fetches an artifact off the console's origin.
A live console, the real Redis channel layer, a real worker process."""

from __future__ import annotations

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from rest_framework.authtoken.models import Token

from registry.fleet.push_key import console_push_key
from registry.models import ModelVersion, ServingGeneration
from serving.contract import APPLY_MESSAGE, SERVING_GROUP, DesiredState, ModelState, Route
from serving.state_signing import push_signing_key, sign_push, sign_state, signing_key
from tests.fixtures.recording_host import RecordingHost
from tools.stack import running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(tmp_path, settings, model):
    assert settings.REDIS_URL, "needs REDIS_URL (make test sets it): the forged pushes travel on the real channel layer"
    # The console's secret is this test's, so the test can sign as that console does.
    with running_stack(tmp_path, settings, connection.settings_dict, DJANGO_SECRET_KEY=settings.SECRET_KEY) as stack:
        yield stack


@pytest.fixture
def foreign_host():
    host = RecordingHost(b"not a model")
    yield host
    host.close()


def publish(stack, settings, state) -> None:
    """What an intruder on Redis does: send to the workers' group with the stack's prefix."""
    from channels_redis.core import RedisChannelLayer

    async def send():
        layer = RedisChannelLayer(hosts=[settings.REDIS_URL], prefix=stack.env["CHANNEL_LAYER_PREFIX"])
        await layer.group_send(SERVING_GROUP, {"type": APPLY_MESSAGE, "state": state})
        await layer.close_pools()

    async_to_sync(send)()


def routes_of(worker) -> list:
    return httpx.get(worker.url + "/v2/models/tiny", timeout=5).json()["parameters"]["routes"]


def foreign_state(foreign_host, generation: int) -> dict:
    version = ModelVersion.objects.get(model__name="tiny", number=2)
    route = Route(version=2, weight=100, sha256=version.sha256, artifact_url=f"{foreign_host.url}/model.onnx")
    epoch = ServingGeneration.objects.get(pk=1).epoch
    return DesiredState(generation=generation, epoch=epoch, models={"tiny": ModelState(routes=(route,), generation=generation)}).to_dict()


def test_forged_pushes_change_nothing_are_logged_and_do_not_freeze_the_worker(stack, settings, operator, foreign_host):
    worker = stack.start_worker()
    forged = foreign_state(foreign_host, 10**15)

    publish(stack, settings, forged)  # unsigned
    publish(stack, settings, sign_push(forged, push_signing_key("another-consoles-secret")))

    assert wait_until(lambda: worker.log().count('"push_refused"') >= 2, 10), worker.log()
    log = worker.log()
    assert '"reason": "the state is not signed"' in log
    assert "the signature does not match (not signed by the console's push key)" in log
    assert foreign_host.url not in log  # the reason is logged, not the payload
    assert routes_of(worker) == [{"version": 1, "weight": 100}]
    assert foreign_host.received == []
    # Not frozen by the forged generation: the console's next change is served.
    token, _ = Token.objects.get_or_create(user=operator)
    headers = {"Authorization": f"Token {token.key}"}
    answer = httpx.post(f"{stack.console.url}/api/models/tiny/release/", json={"routes": [{"version": 2, "weight": 100}]}, headers=headers, timeout=30)
    assert answer.status_code == 201
    assert wait_until(lambda: routes_of(worker) == [{"version": 2, "weight": 100}], 10)


def test_a_signed_state_naming_a_foreign_artifact_host_is_refused_and_no_request_reaches_it(stack, settings, foreign_host):
    worker = stack.start_worker()
    generation = ServingGeneration.objects.get(pk=1).generation + 1

    publish(stack, settings, sign_push(foreign_state(foreign_host, generation), console_push_key()))

    assert wait_until(lambda: "is not on the console's origin" in worker.log(), 10), worker.log()
    assert routes_of(worker) == [{"version": 1, "weight": 100}]
    assert foreign_host.received == []
    # The console issued no such state, so it refuses the worker's failure ack too.
    assert wait_until(lambda: f"ack of generation {generation} refused: 400" in worker.log(), 5)


@pytest.mark.parametrize("signature", ["an HMAC keyed from the worker token", "an Ed25519 key derived from the worker token"])
def test_a_push_signed_with_what_every_worker_holds_is_refused(stack, settings, foreign_host, signature):
    # Pushes were signed with an HMAC keyed from the worker token: anything with a worker's
    # environment and the Redis password signed states every other worker applied.
    worker = stack.start_worker()
    forged = foreign_state(foreign_host, 10**15)
    token = settings.SERVING_WORKER_TOKEN

    signed = sign_state(forged, signing_key(token)) if signature.startswith("an HMAC") else sign_push(forged, push_signing_key(token))
    publish(stack, settings, signed)

    assert wait_until(lambda: '"push_refused"' in worker.log(), 10), worker.log()
    assert routes_of(worker) == [{"version": 1, "weight": 100}]
    assert foreign_host.received == []
