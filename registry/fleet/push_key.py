"""The console's push key (``serving.state_signing.push_signing_key``), derived from the
Django secret key: every console and Celery process of a deployment signs alike, and a
worker, which is never given that secret, cannot sign a push."""

from __future__ import annotations

from functools import lru_cache

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings

from serving.state_signing import push_key_hex, push_signing_key


def console_push_key() -> Ed25519PrivateKey:
    return _key_of(settings.SECRET_KEY)


def console_push_public_key() -> Ed25519PublicKey:
    return console_push_key().public_key()


def console_push_key_hex() -> str:
    return push_key_hex(console_push_key())


@lru_cache(maxsize=4)  # keyed by the secret: a test (or a rotation) that changes it gets the new key
def _key_of(secret: str) -> Ed25519PrivateKey:
    return push_signing_key(secret)
