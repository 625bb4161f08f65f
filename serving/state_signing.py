"""The desired state's digest and signature, shared by the console and the workers.

Anyone who can publish to the channel layer can put a message on group ``serving``, so a
pushed state is used only when its HMAC proves the console made it. The key is derived
from the worker token (only the console and the workers hold it), never the token itself,
so a MAC seen on the channel says nothing about the bearer credential.

The *digest* names a state's content: sha256 of its canonical encoding (keys sorted, no
whitespace) without the ``digest`` and ``signature`` fields, so it covers the contract
version too (``serving.contract``). Workers ack the digest they applied and the console
judges convergence by it, like Kubernetes' pod-template-hash. The console digests and
signs the ``DesiredState`` it built; a worker digests and verifies the state exactly as
it received it, before parsing any of it. No Django here: the worker imports this too.

A *model digest* names one model's part of a state (its entry, with the state's contract
and epoch): a worker that applied a state but for one model serves the others' issued
entries, and acks and reports say so by these, so the console proves a rollback of one
model while another fails there (``model_digests``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

import orjson

from serving.contract import DesiredState, is_hex64

KEY_CONTEXT = b"modelops-state-v1"
UNSIGNED_FIELDS = ("digest", "signature")


class SignatureRefused(ValueError):
    """A pushed state that did not come from the console; the message says why."""


def signing_key(worker_token: str) -> bytes:
    return hmac.new(worker_token.encode(), KEY_CONTEXT, hashlib.sha256).digest()


def content_of(state: DesiredState | Mapping) -> dict:
    """What the digest and the signature cover: a built state's content, or a received
    state's fields but ``digest`` and ``signature``."""
    if isinstance(state, DesiredState):
        return state.content()
    return {key: value for key, value in state.items() if key not in UNSIGNED_FIELDS}


def canonical_json(value: object) -> bytes:
    """One byte string per value: a JSON round trip (HTTP, msgpack) encodes the same."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def state_digest(state: DesiredState | Mapping) -> str:
    """sha256 of the state's canonical content; ValueError when it is not JSON data."""
    try:
        return hashlib.sha256(canonical_json(content_of(state))).hexdigest()
    except orjson.JSONEncodeError as error:  # non-string keys, integers past 64 bits
        raise ValueError(f"the state is not canonical JSON: {error}") from None


def model_digests(state: DesiredState | Mapping | None) -> dict[str, str]:
    """Each model's digest: sha256 of the canonical {contract, epoch, model, entry}. The
    entry's own generation is that of its model's release, so a model no later state
    changed keeps its digest from one generation to the next."""
    content = content_of(state) if state is not None else {}
    scope = {"contract": content.get("contract"), "epoch": content.get("epoch")}
    return {name: hashlib.sha256(canonical_json({**scope, "model": name, "entry": entry})).hexdigest()
            for name, entry in content.get("models", {}).items()}


def checked_digest(state: Mapping) -> str:
    """The digest of ``state``'s content, which must be the digest it names (when it names
    one); ValueError naming the problem otherwise. Whatever a worker applies from the
    console passes this first: a state whose routes and digest disagree is torn or forged."""
    digest = state_digest(state)
    if state.get("digest", digest) != digest:
        raise ValueError("the digest does not match the content")
    return digest


def sign_state(state: DesiredState | Mapping, key: bytes) -> dict:
    """The state with its ``digest`` and ``signature`` (HMAC-SHA256 of the content)."""
    content = content_of(state)
    encoded = canonical_json(content)
    return {**content, "digest": hashlib.sha256(encoded).hexdigest(), "signature": hmac.new(key, encoded, hashlib.sha256).hexdigest()}


def verify_state(state: object, key: bytes) -> str:
    """The digest of a pushed state whose signature holds; SignatureRefused otherwise."""
    if not isinstance(state, dict):
        raise SignatureRefused("the state is not an object")
    signature = state.get("signature")
    if signature is None:
        raise SignatureRefused("the state is not signed")
    if not is_hex64(signature):
        raise SignatureRefused("the signature is not 64 lowercase hex characters")
    try:
        encoded = canonical_json(content_of(state))
    except orjson.JSONEncodeError:
        raise SignatureRefused("the state is not canonical JSON") from None
    if not hmac.compare_digest(hmac.new(key, encoded, hashlib.sha256).hexdigest(), signature):
        raise SignatureRefused("the signature does not match (not signed by this console's key)")
    digest = hashlib.sha256(encoded).hexdigest()
    if state.get("digest") != digest:
        raise SignatureRefused("the digest does not match the content")
    return digest
