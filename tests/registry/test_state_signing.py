"""The desired state's epoch, digest and signature, as the console builds and pushes it."""

from __future__ import annotations

import hashlib
import hmac

import msgpack
import orjson
import pytest

from registry import broadcast
from registry.fleet import publish
from registry.fleet.push_key import console_push_key_hex
from registry.fleet.state import desired_state, issued_digest, state_at
from registry.models import ServingGeneration
from serving.state_signing import (
    PUSH_KEY_HEADER,
    PUSH_VALID_S,
    PushExpired,
    SignatureRefused,
    canonical_json,
    model_digests,
    parse_push_key,
    push_key_hex,
    push_signing_key,
    sign_push,
    sign_state,
    signing_key,
    state_digest,
    verify_push,
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


_ORDER_8_Y = "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"


@pytest.mark.parametrize(
    "named",
    ["01" + "00" * 31, "00" * 32, "00" * 31 + "80", "ec" + "ff" * 30 + "7f", "ee" + "ff" * 30 + "7f", _ORDER_8_Y, _ORDER_8_Y[:-2] + "85",
     "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"],
    ids=["identity", "order 4", "order 4 signed", "order 2", "identity non-canonical", "order 8", "order 8 signed", "order 8 other"],
)
def test_a_push_key_of_small_order_is_refused_for_under_it_anyone_signs(named):
    # Under the identity key, R = identity and S = 0 verify for every message.
    with pytest.raises(ValueError, match="small order"):
        parse_push_key(named)


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


def test_a_push_key_is_derived_from_the_consoles_secret_and_differs_with_it():
    key = push_signing_key("secret")

    assert push_key_hex(key) == push_key_hex(push_signing_key("secret"))
    assert push_key_hex(key) != push_key_hex(push_signing_key("another secret"))
    assert len(push_key_hex(key)) == 64


def test_a_pushed_state_verifies_with_the_public_key_alone_after_json_and_msgpack_round_trips():
    key = push_signing_key("secret")
    signed = sign_push({"generation": 9, "epoch": "e", "models": {"b": {"x": 1e-05}, "a": [1, 2.5, None, True]}}, key)
    public = parse_push_key(push_key_hex(key))

    for copy in (orjson.loads(orjson.dumps(signed)), msgpack.unpackb(msgpack.packb(signed), raw=False)):
        assert verify_push(copy, public) == signed["digest"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [({"generation": 10}, "signature does not match"), ({"signature": None}, "not signed"), ({"digest": "0" * 64}, "digest does not match"),
     ({"signature": "A" * 128}, "128 lowercase hex"), ({"signature": "a" * 64}, "a 64-character HMAC, as consoles signed pushes before")],
)
def test_a_changed_or_unsigned_push_is_refused(change, reason):
    key = push_signing_key("secret")
    signed = sign_push({"generation": 9, "epoch": "e", "models": {}}, key)

    with pytest.raises(SignatureRefused, match=reason):
        verify_push({**signed, **change}, key.public_key())


@pytest.mark.parametrize("length", [127, 129, 130])
def test_a_push_whose_signature_is_not_128_hex_characters_is_refused_before_it_is_checked(length):
    # Refused by its length, before the key's check: there an odd number of hex characters
    # raises a bare ValueError (not SignatureRefused), which the worker's push handler does not catch.
    key = push_signing_key("secret")
    signed = sign_push({"generation": 9, "epoch": "e", "models": {}}, key)
    signature = (signed["signature"] * 2)[:length]

    with pytest.raises(SignatureRefused, match="128 lowercase hex"):
        verify_push({**signed, "signature": signature}, key.public_key())


@pytest.mark.parametrize("offset_s", [PUSH_VALID_S + 1, -PUSH_VALID_S - 1])
def test_a_push_signed_longer_ago_than_it_is_valid_or_ahead_of_the_clock_is_refused_as_expired(offset_s):
    # A signature is valid for ever: anything on Redis could replay a push the console had
    # since replaced, and a restored database's console, with Redis restarted, did not notice.
    key = push_signing_key("secret")
    signed = sign_push({"generation": 9, "epoch": "e", "models": {}}, key, signed_at=1_000_000.0)

    assert verify_push(signed, key.public_key(), now=1_000_000.0 + PUSH_VALID_S) == signed["digest"]
    with pytest.raises(PushExpired, match="more than 300 s: replayed, or the clocks are that far apart"):
        verify_push(signed, key.public_key(), now=1_000_000.0 + offset_s)


@pytest.mark.parametrize("signed_at", [2_000_000.0, None, "1000000.0", float("nan")])
def test_a_push_whose_signing_time_was_changed_or_left_out_is_refused(signed_at):
    key = push_signing_key("secret")
    signed = sign_push({"generation": 9, "epoch": "e", "models": {}}, key, signed_at=1_000_000.0)

    with pytest.raises(SignatureRefused) as refused:
        verify_push({**signed, "signed_at": signed_at}, key.public_key(), now=1_000_000.0)
    assert not isinstance(refused.value, PushExpired)


def test_the_signing_time_is_not_part_of_the_digest():
    key = push_signing_key("secret")
    state = {"generation": 9, "epoch": "e", "models": {}}

    assert sign_push(state, key, signed_at=1.0)["digest"] == sign_push(state, key, signed_at=2.0)["digest"] == state_digest(state)


def test_a_push_signed_with_another_key_is_refused():
    with pytest.raises(SignatureRefused, match="not signed by the console's push key"):
        verify_push(sign_push({"generation": 1, "models": {}}, push_signing_key("other")), push_signing_key("secret").public_key())


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_a_copy_of_a_signed_state_with_nan_or_infinity_for_null_is_refused(number):
    # orjson writes NaN and infinities as null: such a copy verified as the original, and
    # failed to apply, so the console was told its own state could not be applied.
    key = push_signing_key("secret")
    signed = sign_push({"generation": 1, "models": {"m": {"batching": {"latency_target_s": None}}}}, key)
    copy = {**signed, "models": {"m": {"batching": {"latency_target_s": number}}}}

    with pytest.raises(SignatureRefused, match="not canonical JSON"):
        verify_push(copy, key.public_key())
    with pytest.raises(ValueError, match="not canonical JSON"):
        state_digest(copy)


def test_a_pushed_state_that_is_not_canonical_json_is_never_signed():
    with pytest.raises(orjson.JSONEncodeError):
        sign_push({"generation": 1, "models": {"m": {"x": [1.0, float("nan")]}}}, push_signing_key("secret"))


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


def test_serving_state_endpoint_names_the_consoles_public_push_key(client, settings, three_versions):
    response = client.get("/api/serving/state", HTTP_AUTHORIZATION=f"Bearer {settings.SERVING_WORKER_TOKEN}")

    assert response[PUSH_KEY_HEADER] == console_push_key_hex() == push_key_hex(push_signing_key(settings.SECRET_KEY))


def test_the_state_of_an_earlier_generation_is_what_was_issued_then(operator_client, three_versions):
    first = desired_state()
    operator_client.post(RELEASE, {"routes": [{"version": 2, "weight": 100}]}, format="json")

    assert state_at(first["generation"], first["epoch"]) == first
    assert issued_digest(first["generation"]) == first["digest"]
    assert issued_digest(desired_state()["generation"]) == desired_state()["digest"] != first["digest"]
    assert issued_digest(desired_state()["generation"] + 1) is None


def test_every_published_state_is_signed_with_the_key_the_state_endpoint_names(client, operator_client, three_versions, settings, monkeypatch):
    sent = []

    class Layer:
        async def group_send(self, group, message):
            sent.append((group, message))

    monkeypatch.setattr(broadcast, "get_channel_layer", Layer)

    publish.publish_desired_state()

    [(group, message)] = sent
    assert (group, message["type"]) == ("serving", "serving.apply")
    named = client.get("/api/serving/state", HTTP_AUTHORIZATION=f"Bearer {settings.SERVING_WORKER_TOKEN}")[PUSH_KEY_HEADER]
    assert verify_push(message["state"], parse_push_key(named)) == desired_state()["digest"]
    with pytest.raises(SignatureRefused):  # nothing a worker holds makes or checks it
        verify_state(message["state"], signing_key(settings.SERVING_WORKER_TOKEN))
