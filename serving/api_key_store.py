"""The last API-key set this worker fetched from the console, kept beside its artifact cache.

A worker restarted while the console cannot answer serves its persisted routes
(serving/state_store.py); with SERVING_API_KEYS on it must also know which keys are
valid, or every client key is 401 until the console returns. So each set the console
gives is written to ``api-keys.json`` in SERVING_CACHE_DIR, and read at start when the
console cannot answer the key fetch. When the console answers, its set wins (and is
written). The tradeoff is the routes': a key revoked during the outage stays valid on a
worker started from this file until the console answers again.

The file holds sha256 digests only, never a key: ``{"format": "modelops-api-keys-v1",
"sha256": [sorted 64-hex, ...], "digest": …, "signature": …}``, signed like the persisted
state (``state_signing.sign_state``) but with a key derived for this file from the worker
token, so neither file can stand in for the other. It is written and read by the state
store's own code (this is a ``StateStore`` with another file and other content checks):
written atomically (exclusive temporary file, fsync, rename), mode 0600; read without
following a link, only if it is a regular file of this process's user writable by no
one else, at most ``MAX_FILE_BYTES``; then the format, digest and signature are checked
and the digests validated as a fetched set is (``api_keys.parse_digests``). Anything
wrong raises ``PersistedStateRefused``; the refresher logs it and starts with no key.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from serving.api_keys import parse_digests
from serving.state_signing import SignatureRefused, verify_state
from serving.state_store import MAX_FILE_BYTES, PersistedStateRefused, StateStore

__all__ = ["FILE_NAME", "FORMAT", "MAX_FILE_BYTES", "ApiKeyStore", "PersistedStateRefused", "api_keys_signing_key"]

FILE_NAME = "api-keys.json"
FORMAT = "modelops-api-keys-v1"
KEY_CONTEXT = b"modelops-api-keys-v1"  # not the state's: a signed key set is never a signed state


def api_keys_signing_key(worker_token: str) -> bytes:
    return hmac.new(worker_token.encode(), KEY_CONTEXT, hashlib.sha256).digest()


class ApiKeyStore(StateStore):
    """``save(digests)`` / ``load() -> digests | None``, in ``directory``/api-keys.json."""

    def __init__(self, directory: str | Path, key: bytes | None):
        super().__init__(directory, key)
        self.path = Path(directory) / FILE_NAME

    def save(self, digests: frozenset[str]) -> str:  # type: ignore[override]
        """Persist the set (digests only), signed; returns the file's content digest."""
        if self._key is None:
            raise PersistedStateRefused("this worker has no worker token to sign its persisted API keys with")
        return super().save({"format": FORMAT, "sha256": sorted(digests)})

    def load(self) -> frozenset[str] | None:  # type: ignore[override]
        """The persisted set, re-checked; None when there is no file; PersistedStateRefused
        when there is one that must not be used."""
        if self._key is None:
            raise PersistedStateRefused("this worker has no worker token to check its persisted API keys with")
        document = self._read()  # no link, regular file, ours, not writable by others, size-limited, a JSON object
        if document is None:
            return None
        if document.get("format") != FORMAT:
            raise PersistedStateRefused(f"{self.path} is not an API-key file of this worker (format {document.get('format')!r})")
        try:
            verify_state(document, self._key)
        except SignatureRefused as refusal:
            raise PersistedStateRefused(str(refusal)) from None
        try:
            return parse_digests(document)
        except ValueError as error:
            raise PersistedStateRefused(f"{self.path}: {error}") from None
