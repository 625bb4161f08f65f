"""Inference API keys on the worker: a ring of sha256 digests, checked from the headers.

The console keeps only each key's sha256 and hands the active set to workers
(`GET /api/serving/api-keys`, worker token). A worker hashes what the client sent
(`Authorization: Bearer <key>` or `X-API-Key: <key>`) and looks the digest up: one
sha256 of a few dozen bytes per request, before the body is read. A digest reveals
nothing usable about a key, so the lookup need not be constant-time.

SERVING_API_KEYS: `off` (no check), `optional` (no key is fine, a wrong one is 401),
`required` (no valid key is 401). The refresher keeps the last set it fetched when the
console is down: revocations then wait for the console, serving does not. It also writes
each set it fetches beside the artifact cache (serving/api_key_store.py: digests only,
signed, mode 0600), and a worker whose console cannot answer at start reads it back, so a
restart during an outage keeps serving its clients' keys as it keeps serving its routes;
the same tradeoff: a key revoked meanwhile stays valid there until the console answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
from typing import TYPE_CHECKING

import httpx

from serving.errors import Unauthorized
from serving.logs import event
from serving.state_store import PersistedStateRefused

if TYPE_CHECKING:
    from serving.api_key_store import ApiKeyStore

logger = logging.getLogger("serving.api_keys")

MODES = ("off", "optional", "required")
KEYS_PATH = "/api/serving/api-keys"
MAX_KEY_BYTES = 256  # longer is no key of ours; refused without hashing megabytes
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def bearer(authorization: bytes | None) -> bytes | None:
    """The credential of an `Authorization: Bearer …` header, else None."""
    if authorization is None or authorization[:7].lower() != b"bearer ":
        return None
    return authorization[7:].strip()


def digest(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()


def worker_token_matches(authorization: bytes | None, token: bytes) -> bool:
    given = bearer(authorization)
    return given is not None and hmac.compare_digest(given, token)


class ApiKeyRing:
    """The active key digests and the mode; `replace` swaps the whole set by reference."""

    def __init__(self, mode: str = "off", digests: frozenset[str] = frozenset()):
        if mode not in MODES:
            raise ValueError(f"API key mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.digests = frozenset(digests)
        self.is_on = mode != "off"

    def replace(self, digests: frozenset[str]) -> None:
        self.digests = frozenset(digests)

    def check(self, api_key: bytes | None, authorization: bytes | None) -> None:
        """Raise Unauthorized unless the headers carry what the mode asks for."""
        if not self.is_on:
            return
        key = api_key if api_key is not None else bearer(authorization)
        if key is None or not key:
            if self.mode == "required":
                raise Unauthorized("an API key is required: send Authorization: Bearer <key> or X-API-Key: <key>")
            return
        if len(key) > MAX_KEY_BYTES or digest(key) not in self.digests:
            raise Unauthorized("the API key is not valid (unknown or revoked)")


def parse_digests(document: object) -> frozenset[str]:
    """The console's answer `{"sha256": [64-hex, ...]}`; ValueError on anything else."""
    items = document.get("sha256") if isinstance(document, dict) else None
    if not isinstance(items, list) or not all(isinstance(item, str) and _SHA256_HEX.fullmatch(item) for item in items):
        raise ValueError("expected {\"sha256\": [64 lowercase hex characters, ...]}")
    return frozenset(items)


class ApiKeyRefresher:
    """Fetches the active digests at start and every `interval_s`; a failure keeps the
    last set (logged), so an outage of the console never stops serving. With a `store`,
    each set fetched is persisted, and read back at start when the console cannot answer."""

    def __init__(self, ring: ApiKeyRing, http: httpx.Client, url: str, interval_s: float, store: ApiKeyStore | None = None):
        self.ring = ring
        self.http = http  # carries the worker token; its own timeout
        self.url = url
        self.interval_s = interval_s
        self.store = store
        self._persisted: frozenset[str] | None = None  # what the file holds, as far as this process knows
        self._task: asyncio.Task | None = None

    def fetch(self) -> frozenset[str]:
        response = self.http.get(self.url)
        response.raise_for_status()
        return parse_digests(response.json())

    async def refresh(self) -> bool:
        try:
            digests = await asyncio.get_running_loop().run_in_executor(None, self.fetch)
        except (httpx.HTTPError, ValueError) as error:
            logger.warning("API keys not refreshed (%s); keeping the last %d", error, len(self.ring.digests))
            return False
        self.ring.replace(digests)
        if self.store is not None and digests != self._persisted:
            await self._persist(digests)
        return True

    async def _persist(self, digests: frozenset[str]) -> None:
        """Write the set; a failure is logged and tried again at the next refresh, never fatal."""
        try:
            await asyncio.to_thread(self.store.save, digests)
        except (OSError, PersistedStateRefused) as error:
            logger.warning(event("api_keys_not_persisted", path=str(self.store.path), reason=str(error)))
            return
        self._persisted = digests

    async def load_persisted(self) -> bool:
        """The set persisted by the last fetch, into the ring; anything wrong with the file
        is logged and leaves the ring as it is (no key), never fatal."""
        try:
            digests = await asyncio.to_thread(self.store.load)
        except (PersistedStateRefused, OSError) as refusal:
            logger.warning(event("api_keys_persisted_refused", path=str(self.store.path), reason=str(refusal),
                                 consequence="no API key is valid until the console answers"))
            return False
        if digests is None:
            logger.warning(event("no_api_keys", reason="no persisted API keys; no API key is valid until the console answers"))
            return False
        self.ring.replace(digests)
        self._persisted = digests
        logger.warning(event("serving_persisted_api_keys", path=str(self.store.path), keys=len(digests)))
        return True

    async def start(self) -> None:
        # Before the first request: `required` must not start open.
        if not await self.refresh() and self.store is not None:
            await self.load_persisted()
        self._task = asyncio.create_task(self._refresh_forever(), name="api-keys-refresh")

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.refresh()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.http.close()
