"""Talks to the console: the desired serving state and version artifacts.

Every call has an explicit timeout. Artifacts are verified against their sha256 before
anyone loads them; a file:// URL, or an absolute path that exists on this machine, is
read locally (benchmarks, tests), anything else relative is joined to CONSOLE_URL.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx
import orjson

CHUNK_BYTES = 1024 * 1024


class ArtifactError(Exception):
    """The artifact could not be fetched, or its bytes are not the ones promised."""


class StateError(Exception):
    """The desired state could not be fetched or read."""


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def local_path(url: str) -> Path | None:
    """The local file an artifact URL names, or None when it must be downloaded."""
    if url.startswith("file://"):
        return Path(unquote(urlparse(url).path))
    if url.startswith("/") and os.path.isfile(url):
        return Path(url)
    return None


def read_state_file(path: str | Path) -> dict:
    try:
        document = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise StateError(f"cannot read state file {path}: {exc}") from None
    if not isinstance(document, dict):
        raise StateError(f"state file {path} does not hold a JSON object")
    return document


class ConsoleClient:
    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # Connect fast, but allow a slow big download between chunks.
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0))
        self._http = httpx.Client(headers=headers, timeout=timeout, transport=transport)

    def fetch_state(self) -> dict:
        """GET {console}/api/serving/state; StateError on any failure (retryable)."""
        try:
            response = self._http.get(f"{self.base_url}/api/serving/state")
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise StateError(f"cannot fetch the serving state: {exc}") from None
        if not isinstance(document, dict):
            raise StateError("the serving state is not a JSON object")
        return document

    def fetch_artifact(self, url: str, sha256: str, dest: Path) -> Path:
        """A verified local copy of the artifact: `dest` (downloaded) or the local file."""
        source = local_path(url)
        if source is not None:
            return _verified(source, sha256)
        if dest.is_file() and sha256_of_file(dest) == sha256:
            return dest  # cache hit: the cache is keyed by sha256
        return self._download(url, sha256, dest)

    def _download(self, url: str, sha256: str, dest: Path) -> Path:
        absolute = url if url.startswith(("http://", "https://")) else f"{self.base_url}/{url.lstrip('/')}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(f"{dest.name}.{os.getpid()}.part")
        digest = hashlib.sha256()
        try:
            with self._http.stream("GET", absolute) as response:
                response.raise_for_status()
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes(CHUNK_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
        except (httpx.HTTPError, OSError) as exc:
            partial.unlink(missing_ok=True)
            raise ArtifactError(f"cannot download {absolute}: {exc}") from None
        if digest.hexdigest() != sha256:
            partial.unlink(missing_ok=True)
            raise ArtifactError(f"sha256 mismatch for {absolute}: got {digest.hexdigest()}, expected {sha256}")
        partial.replace(dest)  # atomic: a reader never sees a half-written cache entry
        return dest

    def close(self) -> None:
        self._http.close()


def _verified(path: Path, sha256: str) -> Path:
    try:
        actual = sha256_of_file(path)
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror}") from None
    if actual != sha256:
        raise ArtifactError(f"sha256 mismatch for {path}: got {actual}, expected {sha256}")
    return path
