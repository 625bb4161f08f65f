"""The desired state's epoch, digest and signature, as the console builds and pushes it."""

from __future__ import annotations

import hashlib
import hmac

import msgpack
import orjson
import pytest

from registry import broadcast
from registry.fleet import publish
from registry.fleet.state import desired_state, issued_digest, state_at
from registry.models import ServingGeneration
from serving.state_signing import (
    SignatureRefused,
    canonical_json,
    model_digests,
    sign_state,
    signing_key,
    state_digest,
    verify_state,
)

pytestmark = pytest.mark.django_db
RELEASE = "/api/models/digits/release/"


def test_signing_key_is_derived_from_the_worker_token_not_the_token_itself():
    key = signing_key("token")

    assert key == hmac.new(b"token", b"modelops-state-v1", hashlib.sha256).digest()
    assert key != b"token"


def test_digest_covers_the_content_without_digest_and_signature():
    state = {"generation": 2, "epoch": "e", "models": {"m": {"routes": [], "batching": {"max_queue_delay_s": 0.002}}}}

    signed = sign_state(state, signing_key("t"))

    assert signed["digest"] == hashlib.sha256(canonical_json(state)).hexdigest() == state_digest(signed)
    assert signed["signature"] == hmac.new(signing_key("t"), canonical_json(state), hashlib.sha256).hexdigest()


def test_a_models_digest_is_of_its_entry_with_the_states_contract_and_epoch():
    entry = {"generation": 2, "routes": [], "batching": {"max_queue_delay_s": 0.002}}
    state = {"contract": 2, "generation": 5, "epoch": "e", "models": {"m": entry}}

    assert model_digests(state) == {"m": hashlib.sha256(canonical_json({"contract": 2, "epoch": "e", "model": "m", "entry": entry})).hexdigest()}


def test_a_models_digest_stays_when_another_model_or_the_generation_changes():
    entry = {"generation": 2, "routes": [], "batching": {"max_queue_delay_s": 0.002}}
    before = {"contract": 2, "generation": 5, "epoch": "e", "models": {"m": entry, "other": {"generation": 4, "routes": []}}}
    after = {**before, "generation": 6, "models": {"m": entry, "other": {"generation": 6, "routes": []}}}

    assert model_digests(after)["m"] == model_digests(before)["m"]
    assert model_digests(after)["other"] != model_digests(before)["other"]


@pytest.mark.parametrize("change", [{"epoch": "another database"}, {"contract": 3}, {"models": {"n": {"routes": []}}}])
def test_the_same_entry_in_another_epoch_contract_or_name_has_another_digest(change):
    state = {"contract": 2, "generation": 5, "epoch": "e", "models": {"m": {"routes": []}}}

    assert set(model_digests({**state, **change}).values()).isdisjoint(model_digests(state).values())


def test_a_signed_state_verifies_after_json_and_msgpack_round_trips():
    signed = sign_state({"generation": 9, "epoch": "e", "models": {"b": {"x": 1e-05}, "a": [1, 2.5, None, True]}}, signing_key("t"))

    for copy in (orjson.loads(orjson.dumps(signed)), msgpack.unpackb(msgpack.packb(signed), raw=False)):
        assert verify_state(copy, signing_key("t")) == signed["digest"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [({"generation": 10}, "signature does not match"), ({"signature": None}, "not signed"), ({"digest": "0" * 64}, "digest does not match"),
     ({"signature": "A" * 64}, "64 lowercase hex")],
)
def test_a_changed_or_unsigned_state_is_refused(change, reason):
    signed = sign_state({"generation": 9, "epoch": "e", "models": {}}, signing_key("t"))

    with pytest.raises(SignatureRefused, match=reason):
        verify_state({**signed, **change}, signing_key("t"))


def test_a_state_signed_with_another_key_is_refused():
    with pytest.raises(SignatureRefused, match="signature does not match"):
        verify_state(sign_state({"generation": 1, "models": {}}, signing_key("other")), signing_key("t"))


def test_desired_state_carries_the_epoch_and_the_digest_of_its_content(three_versions):
    counter = ServingGeneration.objects.get(pk=1)

    state = desired_state()

    assert (state["generation"], state["epoch"]) == (counter.generation, counter.epoch)
    assert state["digest"] == state_digest(state)
    assert "signature" not in state


def test_serving_state_endpoint_serves_epoch_and_digest_but_no_signature(client, settings, three_versions):
    state = client.get("/api/serving/state", HTTP_AUTHORIZATION=f"Bearer {settings.SERVING_WORKER_TOKEN}").json()

    assert state == desired_state()
    assert "signature" not in state


def test_the_state_of_an_earlier_generation_is_what_was_issued_then(operator_client, three_versions):
    first = desired_state()
    operator_client.post(RELEASE, {"routes": [{"version": 2, "weight": 100}]}, format="json")

    assert state_at(first["generation"], first["epoch"]) == first
    assert issued_digest(first["generation"]) == first["digest"]
    assert issued_digest(desired_state()["generation"]) == desired_state()["digest"] != first["digest"]
    assert issued_digest(desired_state()["generation"] + 1) is None


def test_every_published_state_is_signed_with_the_worker_key(operator_client, three_versions, settings, monkeypatch):
    sent = []

    class Layer:
        async def group_send(self, group, message):
            sent.append((group, message))

    monkeypatch.setattr(broadcast, "get_channel_layer", Layer)

    publish.publish_desired_state()

    [(group, message)] = sent
    assert (group, message["type"]) == ("serving", "serving.apply")
    assert verify_state(message["state"], signing_key(settings.SERVING_WORKER_TOKEN)) == desired_state()["digest"]
