"""Talks to the console: the desired serving state and version artifacts.

Every call has an explicit timeout. Artifacts are verified against their sha256 before
anyone loads them. The bearer token never leaves the console's origin: artifact URLs
are relative to CONSOLE_URL or absolute on that same scheme, host and port, and the HTTP
client refuses any other request (redirects are not followed). Local paths and file://
URLs are read only with SERVING_ALLOW_LOCAL_ARTIFACTS (development, benchmarks, tests)
or in ``--state-file`` mode, where no state comes from the network.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx
import orjson

from serving.artifact_cache import mark_used, open_partial
from serving.logs import event
from serving.state_signing import checked_digest

logger = logging.getLogger("serving.console_client")

CHUNK_BYTES = 1024 * 1024
DEFAULT_PORTS = {"http": 80, "https": 443}
SHOWN_URL_CHARS = 80
MAX_ERROR_BYTES = 4096  # of a refused download's body: the console's error, never a file
ERROR_READ_S = 5.0  # reading it, however slowly it comes
DOWNLOAD_RETRY_FIRST_S = 3.0  # after a download that could not be kept; doubling to the next
DOWNLOAD_RETRY_MAX_S = 60.0


class ArtifactError(Exception):
    """The artifact could not be fetched, or its bytes are not the ones promised."""


class ArtifactNotKept(ArtifactError):
    """Bytes were downloaded that could not be kept: not the promised ones, or no room for them."""


class ArtifactRefused(ArtifactError):
    """The artifact URL points somewhere the worker must not read from."""


class StateError(Exception):
    """The desired state could not be fetched or read."""


class ForeignOrigin(httpx.RequestError):
    """A request to anything but the console: refused before it is sent."""


def origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an absolute http(s) URL, else None."""
    try:
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:  # a port that is not a number
        return None
    if scheme not in DEFAULT_PORTS or not host:
        return None
    return scheme, host, port


def artifact_location(url: object, console_url: str, *, allow_local: bool) -> str:
    """Where an artifact may be read: an absolute URL on the console's origin, or (with
    ``allow_local``) a local path. ArtifactRefused names why anything else is refused."""
    if not isinstance(url, str) or not url:
        raise ArtifactRefused("artifact_url must be a non-empty string")
    shown = url[:SHOWN_URL_CHARS]
    if url.startswith("file://") or (url.startswith("/") and os.path.isfile(url)):
        if not allow_local:
            raise ArtifactRefused(f"local artifact {shown!r} refused: local paths need SERVING_ALLOW_LOCAL_ARTIFACTS=true")
        host = urlsplit(url).hostname if url.startswith("file://") else None
        if host not in (None, "localhost"):  # file://otherhost/x read /x of this machine
            raise ArtifactRefused(f"local artifact {shown!r} refused: a file:// URL names no host but this one")
        path = local_path(url)
        if not path.is_absolute():
            raise ArtifactRefused(f"local artifact {shown!r} refused: name it by absolute path")
        # A file:// URL, not a bare path: read again (fetch_artifact), a path that had gone
        # missing meanwhile was taken for one relative to the console and downloaded from it.
        return path.as_uri()
    parts = urlsplit(url)
    if not parts.scheme and not parts.netloc:
        return f"{console_url.rstrip('/')}/{url.lstrip('/')}"
    if origin(url) is None or origin(url) != origin(console_url):
        raise ArtifactRefused(f"artifact URL {shown!r} is not on the console's origin {console_url}")
    return url


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def local_path(url: str) -> Path | None:
    """The local file an artifact URL names, or None when it must be downloaded."""
    if url.startswith("file://"):
        return Path(unquote(urlsplit(url).path))
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


def console_only(console_url: str):
    """An httpx request hook that refuses every request off the console's origin."""
    allowed = origin(console_url)

    def check(request: httpx.Request) -> None:
        if origin(str(request.url)) != allowed:
            raise ForeignOrigin(f"refused to send a request to {str(request.url)[:SHOWN_URL_CHARS]}: not the console", request=request)

    return check


def async_console_only(console_url: str):
    check = console_only(console_url)

    async def async_check(request: httpx.Request) -> None:
        check(request)

    return async_check


def console_timeout(timeout_s: float) -> httpx.Timeout:
    """SERVING_CONSOLE_TIMEOUT_S for every call to the console; connecting takes at most 5 s
    of it, so an unreachable console is noticed fast while a big download may be slow."""
    return httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0))


class ConsoleClient:
    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None, *,
                 allow_local: bool = False):
        self.base_url = base_url.rstrip("/")
        self.allow_local = allow_local
        self.clock = time.monotonic
        self.download_retry_first_s = DOWNLOAD_RETRY_FIRST_S
        self._not_kept: dict[str, tuple[float, float, str]] = {}  # sha256 -> (clock to download again at, wait, why)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(headers=headers, timeout=console_timeout(timeout_s), transport=transport, follow_redirects=False,
                                  event_hooks={"request": [console_only(self.base_url)]})

    def follow(self, base_url: str) -> None:
        """Talk to the console at ``base_url`` from now on (it moved: serving/control.py)."""
        base_url = base_url.rstrip("/")
        # A download thread sending between these two lines is refused by the hook: the token goes nowhere unchecked.
        self._http.event_hooks = {"request": [console_only(base_url)]}
        self.base_url = base_url

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
        try:
            checked_digest(document)
        except ValueError as error:
            raise StateError(f"the serving state is refused: {error}") from None
        return document

    def fetch_artifact(self, url: str, sha256: str, dest: Path) -> Path:
        """A verified local copy of the artifact: `dest` (downloaded) or the local file."""
        location = artifact_location(url, self.base_url, allow_local=self.allow_local)
        if location.startswith("file://"):  # a local file, allowed above
            return _verified(local_path(location), sha256)
        cached = dest.is_file()
        if cached:
            actual = sha256_of_file(dest)
            if actual == sha256:
                mark_used(dest)  # for eviction (serving/artifact_cache.py)
                return dest  # cache hit: the cache is keyed by sha256
            # A disk or a hand that changed the cache is the operator's to know of, even when the download repairs it.
            logger.warning(event("cached_artifact_corrupt", path=str(dest), reason="its sha256 does not match its name",
                                 expected_sha256=sha256, actual_sha256=actual, action="downloading it again"))
        self._refuse_while_waiting(sha256)
        try:
            path = self._download(location, sha256, dest)
            self._not_kept.pop(sha256, None)
            return path
        except ArtifactError as error:
            if isinstance(error, ArtifactNotKept):
                self._wait_after(sha256, str(error))
            if self.allow_local and url.startswith("/"):  # a bare path with no file there went to the console
                raise ArtifactError(f"no local file at {url[:SHOWN_URL_CHARS]}, and as a console path: {error}") from None
            if not cached:
                raise
            # Say so: "cannot download" alone sent an operator after the network.
            raise ArtifactError(f"the cached copy {dest} does not match sha256 {sha256[:12]}…, and {error}") from None

    def _refuse_while_waiting(self, sha256: str) -> None:
        retry_at, wait_s, why = self._not_kept.get(sha256, (0.0, 0.0, ""))
        if self.clock() < retry_at:
            raise ArtifactError(f"{why}; not downloaded again within {wait_s:g} s of that download")

    def _wait_after(self, sha256: str, why: str) -> None:
        """A download that could not be kept (a cache too small for the model, bytes that do
        not match) is not made again for a while, doubling up to DOWNLOAD_RETRY_MAX_S: every
        reconcile (3 s) downloaded it again, about 380 MB a minute from the console per
        worker for a 20 MB model. A download the console refused fetched nothing: not waited."""
        _, last_wait_s, _ = self._not_kept.get(sha256, (0.0, 0.0, ""))
        wait_s = min(last_wait_s * 2, DOWNLOAD_RETRY_MAX_S) if last_wait_s else self.download_retry_first_s
        self._not_kept[sha256] = (self.clock() + wait_s, wait_s, why[:MAX_ERROR_BYTES])

    def _download(self, absolute: str, sha256: str, dest: Path) -> Path:
        # Created exclusively under an unpredictable name: never written through a file or link left in the cache;
        # locked until it is in place, so a start-up sweep never removes it (serving/artifact_cache.py).
        descriptor, partial = open_partial(dest)
        with os.fdopen(descriptor, "wb") as out:
            try:
                self._stream_into(out, absolute, sha256)
                partial.replace(dest)  # atomic: a reader never sees a half-written cache entry
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
        return dest

    def _stream_into(self, out, absolute: str, sha256: str) -> None:
        digest = hashlib.sha256()
        try:
            # identity: a compressed body inflates past any bound on what is read of it.
            with self._http.stream("GET", absolute, headers={"Accept-Encoding": "identity"}) as response:
                if not response.is_success:  # a redirect's body was hashed as the artifact: "sha256 mismatch"
                    raise ArtifactError(f"cannot download {absolute}: {response.status_code} {_console_error(response)}")
                for chunk in response.iter_bytes(CHUNK_BYTES):
                    digest.update(chunk)
                    out.write(chunk)
            out.flush()  # before the rename, while the lock is held
        except httpx.HTTPError as exc:
            raise ArtifactError(f"cannot download {absolute}: {exc}") from None
        except OSError as exc:  # the bytes came, the disk took no more
            raise ArtifactNotKept(f"cannot download {absolute}: {exc}") from None
        if digest.hexdigest() != sha256:
            raise ArtifactNotKept(f"sha256 mismatch for {absolute}: got {digest.hexdigest()}, expected {sha256}")

    def close(self) -> None:
        self._http.close()


def _console_error(response: httpx.Response) -> str:
    """The console's own words for a refused download ({"error": ...}; its 503 for a store
    whose copy changed says so), read from a JSON body of at most MAX_ERROR_BYTES, for at
    most ERROR_READ_S (a body sent a byte at a time held the worker's apply)."""
    length = response.headers.get("Content-Length", "")
    if not response.headers.get("Content-Type", "").startswith("application/json") or not length.isdigit() or int(length) > MAX_ERROR_BYTES:
        return response.reason_phrase
    body, deadline = b"", time.monotonic() + ERROR_READ_S
    for chunk in response.iter_bytes(MAX_ERROR_BYTES):
        body += chunk
        if len(body) >= MAX_ERROR_BYTES or time.monotonic() > deadline:
            break
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    return str(error)[:MAX_ERROR_BYTES] if error else response.reason_phrase


def _verified(path: Path, sha256: str) -> Path:
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the worker's start in open()
            raise ArtifactError(f"cannot read {path}: not a regular file")
        actual = sha256_of_file(path)
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror}") from None
    if actual != sha256:
        raise ArtifactError(f"sha256 mismatch for {path}: got {actual}, expected {sha256}")
    return path
