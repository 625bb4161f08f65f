"""The desired state's digest and signature, shared by the console and the workers.

Anyone who can publish to the channel layer can put a message on group ``serving``, so a
pushed state is used only when its signature proves the console made it. A push is signed
with Ed25519 by a key only the console holds (derived from its Django secret key, which
workers never get): an HMAC keyed from the worker token, which every worker holds, let
anything with a worker's environment and the Redis password sign states every other
worker applied (102 of 111 samples over 12 s on forged routes while re-sent). A worker
learns the console's public key from the console itself, on each read of
``/api/serving/state`` (``PUSH_KEY_HEADER``), and uses no push before it has one.

A worker's own files (its persisted state, its API keys) are signed with an HMAC keyed
from the worker token (``sign_state``): only that worker writes and reads them.

A push also says when it was signed (``signed_at``, covered by its signature, not by its
digest): a worker takes none signed more than ``PUSH_VALID_S`` before (or after, by its
clock) and asks the console instead. A signed push stays a valid signature for ever, so
without it anything on Redis could replay one the console had since replaced, to a
worker that could not ask (a restored database's console, with Redis restarted, did not
notice the replay of a state from before the restore).

Canonical JSON has no NaN or infinity (orjson writes them as null, so a NaN copy of a
signed state verified as the original): a state holding one is not canonical, and is
neither signed nor verified.

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
import math
import time
from collections.abc import Mapping

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from serving.contract import DesiredState, is_hex64

KEY_CONTEXT = b"modelops-state-v1"
PUSH_KEY_CONTEXT = b"modelops-push-ed25519-v1"
# The header of GET /api/serving/state naming the console's public push key (64 hex).
PUSH_KEY_HEADER = "X-Modelops-Push-Key"
UNSIGNED_FIELDS = ("digest", "signature", "signed_at")
# How old (or how far ahead of the worker's clock) a push may be: pushes arrive in
# milliseconds, and a worker that refuses one reconciles, so only clocks further apart than
# this cost anything (each push waits for a reconcile).
PUSH_VALID_S = 300.0


class SignatureRefused(ValueError):
    """A pushed state that did not come from the console; the message says why."""


class PushExpired(SignatureRefused):
    """A push the console signed, but longer ago than ``PUSH_VALID_S``: replayed, or clocks apart."""


def signing_key(worker_token: str) -> bytes:
    return hmac.new(worker_token.encode(), KEY_CONTEXT, hashlib.sha256).digest()


def push_signing_key(console_secret: str) -> Ed25519PrivateKey:
    """The console's push key, derived from its secret: every console and Celery process of
    one deployment shares that secret, so they sign alike, and no worker is given it."""
    return Ed25519PrivateKey.from_private_bytes(hmac.new(console_secret.encode(), PUSH_KEY_CONTEXT, hashlib.sha256).digest())


def push_key_hex(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def parse_push_key(text: str | None) -> Ed25519PublicKey:
    """The public key a console names in ``PUSH_KEY_HEADER``; ValueError when it names none."""
    if text is None or not is_hex64(text):
        raise ValueError(f"the console named no push key ({PUSH_KEY_HEADER}: 64 lowercase hex characters)")
    if _has_small_order(bytes.fromhex(text)):
        raise ValueError(f"the console named a push key of small order ({PUSH_KEY_HEADER}), with which anyone can sign")
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))


# The y-coordinates of Ed25519's eight points of small order (the identity, the point of
# order 2, two of order 4 with y = 0, four of order 8), canonical or not, as libsodium's
# ge25519_has_small_order lists them. OpenSSL verifies without the cofactor check: under
# such a key a signature (R = identity, S = 0) verifies for every message.
_P = 2**255 - 19
_SMALL_ORDER_Y = frozenset({
    0, 1, _P - 1, _P, _P + 1,
    2707385501144840649318225287225658788936804267575313519463743609750303402022,
    55188659117513257062467267217118295137698188065244968500265048394206261417927,
})


def _has_small_order(encoded: bytes) -> bool:
    return int.from_bytes(encoded, "little") & ((1 << 255) - 1) in _SMALL_ORDER_Y


def content_of(state: DesiredState | Mapping) -> dict:
    """What the digest and the signature cover: a built state's content, or a received
    state's fields but ``digest`` and ``signature``."""
    if isinstance(state, DesiredState):
        return state.content()
    return {key: value for key, value in state.items() if key not in UNSIGNED_FIELDS}


def canonical_json(value: object) -> bytes:
    """One byte string per value: a JSON round trip (HTTP, msgpack) encodes the same.
    orjson.JSONEncodeError for what JSON cannot say, NaN and infinities included."""
    _refuse_non_finite(value)
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _refuse_non_finite(value: object) -> None:
    pending = [value]  # a loop, not recursion: a pushed state's depth is the sender's choice
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise orjson.JSONEncodeError(f"{item!r} is not a JSON number")
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)


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
    """The digest of a state this worker signed (``sign_state``) whose signature holds;
    SignatureRefused otherwise."""
    encoded, signature = _signed_parts(state, 64)
    if not hmac.compare_digest(hmac.new(key, encoded, hashlib.sha256).hexdigest(), signature):
        raise SignatureRefused("the signature does not match (not signed with this worker's key)")
    return _digest_named(state, encoded)


def sign_push(state: DesiredState | Mapping, key: Ed25519PrivateKey, signed_at: float | None = None) -> dict:
    """The state with its ``digest``, ``signed_at`` (now, unless given) and ``signature``
    (Ed25519 of the content and ``signed_at``, 128 hex), as pushed."""
    content = content_of(state)
    encoded = canonical_json(content)
    signed_at = round(time.time() if signed_at is None else signed_at, 3)
    return {**content, "digest": hashlib.sha256(encoded).hexdigest(), "signed_at": signed_at,
            "signature": key.sign(_push_message(encoded, signed_at)).hex()}


def verify_push(state: object, key: Ed25519PublicKey, now: float | None = None) -> str:
    """The digest of a pushed state the console's key signed within ``PUSH_VALID_S`` of
    ``now`` (the time, unless given); PushExpired for one signed longer ago, SignatureRefused
    for any other."""
    if isinstance(state, dict) and is_hex64(state.get("signature")):
        raise SignatureRefused("the signature is a 64-character HMAC, as consoles signed pushes before their Ed25519 push key: "
                               "an older console's (followed at each reconcile), or a forgery")
    encoded, signature = _signed_parts(state, 128)
    signed_at = state.get("signed_at")
    if type(signed_at) not in (int, float) or not math.isfinite(signed_at):
        raise SignatureRefused("the push does not say when it was signed (signed_at: seconds since the epoch)")
    try:
        key.verify(bytes.fromhex(signature), _push_message(encoded, signed_at))
    except InvalidSignature:
        raise SignatureRefused("the signature does not match (not signed by the console's push key)") from None
    digest = _digest_named(state, encoded)
    age_s = (time.time() if now is None else now) - signed_at
    if abs(age_s) > PUSH_VALID_S:
        when = f"{age_s:.0f} s ago" if age_s > 0 else f"{-age_s:.0f} s ahead of this clock"
        raise PushExpired(f"the push was signed {when}, more than {PUSH_VALID_S:g} s: replayed, or the clocks are that far apart")
    return digest


def _push_message(encoded: bytes, signed_at: float) -> bytes:
    return encoded + f"\nsigned_at={signed_at:.3f}".encode()


def _signed_parts(state: object, hex_length: int) -> tuple[bytes, str]:
    """The canonical content and the signature of ``state``; SignatureRefused when it has none."""
    if not isinstance(state, dict):
        raise SignatureRefused("the state is not an object")
    signature = state.get("signature")
    if signature is None:
        raise SignatureRefused("the state is not signed")
    if not (isinstance(signature, str) and len(signature) == hex_length and all(c in "0123456789abcdef" for c in signature)):
        raise SignatureRefused(f"the signature is not {hex_length} lowercase hex characters")
    try:
        return canonical_json(content_of(state)), signature
    except orjson.JSONEncodeError:
        raise SignatureRefused("the state is not canonical JSON") from None


def _digest_named(state: dict, encoded: bytes) -> str:
    digest = hashlib.sha256(encoded).hexdigest()
    if state.get("digest") != digest:
        raise SignatureRefused("the digest does not match the content")
    return digest
