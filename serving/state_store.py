"""The last state this worker applied, kept beside its artifact cache.

A worker that starts while the console cannot answer (its database is down, it is
restarting) would otherwise serve nothing until the console returns. With this file it
serves what it served before, and the control plane reconciles once the console answers.

A file on disk is not trusted because it is there. It holds the state signed by this
worker (``state_signing.sign_state``: HMAC keyed from the worker token; a push's Ed25519
signature is the console's, which a worker cannot make), and loading it re-checks
everything: the digest must be the sha256 of the content, the signature must be this
worker's key's, the content must be a state of this worker's contract version
(``serving.contract``: a file written before an upgrade is not served), and the
repository re-verifies every artifact's sha256 from the cache before it loads it. Writes are atomic (temporary file, fsync, rename), mode 0600.

The signature cannot tell this worker's file from any other state the same token ever
signed (every worker holds the token): an older state copied or linked into place would
pass it. So the file must also be where and what this worker wrote: a regular file (not
a link, which is not followed, nor a FIFO, which would block start-up), owned by this
process's user, writable by no one else, in a directory others cannot replace it in. The
temporary file is created exclusively (``mkstemp``), so a file or link left at its name
is never written through.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import orjson

from serving.contract import ContractError, DesiredState
from serving.state_signing import SignatureRefused, content_of, sign_state, state_digest, verify_state

FILE_NAME = "applied-state.json"
MAX_FILE_BYTES = 16 * 1024 * 1024


class PersistedStateRefused(ValueError):
    """The persisted state cannot be used; the message says why."""


class StateStore:
    def __init__(self, directory: str | Path, key: bytes | None):
        self.path = Path(directory) / FILE_NAME
        self._key = key

    def save(self, state: dict) -> str:
        """Persist ``state`` (as applied) signed with this worker's key; returns its digest."""
        if self._key is None:
            raise PersistedStateRefused("this worker has no worker token to sign its persisted state with")
        document = sign_state(content_of(state), self._key)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        descriptor, name = tempfile.mkstemp(dir=self.path.parent, prefix=f"{self.path.name}.", suffix=".tmp")  # O_EXCL, mode 0600
        partial = Path(name)
        try:
            with os.fdopen(descriptor, "wb") as out:
                out.write(orjson.dumps(document, option=orjson.OPT_SORT_KEYS))
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, self.path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        _fsync_directory(self.path.parent)
        return document["digest"]

    def load(self) -> dict | None:
        """The persisted state, re-checked, as it was received (the digest is of those
        bytes); None when there is none. PersistedStateRefused when there is one that
        must not be served."""
        if self._key is None:
            raise PersistedStateRefused("this worker has no worker token to check its persisted state with")
        document = self._read()
        if document is None:
            return None
        try:
            digest = state_digest(document)
        except ValueError as error:
            raise PersistedStateRefused(str(error)) from None
        if document.get("digest") != digest:
            raise PersistedStateRefused("the digest does not match the content (the file changed after it was written)")
        try:
            verify_state(document, self._key)
        except SignatureRefused as refusal:
            raise PersistedStateRefused(str(refusal)) from None
        try:
            DesiredState.parse(document)
        except ContractError as error:
            raise PersistedStateRefused(f"not a desired state of this worker's contract: {error}") from None
        return document

    def artifact_sha256s(self) -> frozenset[str]:
        """Every sha256 the persisted file names, unchecked: artifact eviction keeps these,
        and keeping too much is safe. A file that cannot be read names none: it could not
        be served either."""
        try:
            document = self._read()
        except PersistedStateRefused:
            return frozenset()
        return frozenset(_sha256s(document)) if document is not None else frozenset()

    def _read(self) -> dict | None:
        try:
            descriptor = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            if os.path.islink(self.path):
                raise PersistedStateRefused(f"{self.path} is a symbolic link; only a file this worker wrote is served") from None
            raise PersistedStateRefused(f"cannot read {self.path}: {error.strerror}") from None
        with os.fdopen(descriptor, "rb") as stream:
            _check_ownership(self.path, os.fstat(descriptor))
            try:
                raw = stream.read(MAX_FILE_BYTES + 1)
            except OSError as error:
                raise PersistedStateRefused(f"cannot read {self.path}: {error.strerror}") from None
        if len(raw) > MAX_FILE_BYTES:
            raise PersistedStateRefused(f"{self.path} is larger than {MAX_FILE_BYTES} bytes")
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise PersistedStateRefused(f"{self.path} is not JSON") from None
        if not isinstance(document, dict):
            raise PersistedStateRefused(f"{self.path} does not hold a JSON object")
        return document


def persisted_artifacts(directory: str | Path) -> frozenset[str]:
    """The artifacts the state persisted in ``directory`` names (``StateStore.artifact_sha256s``)."""
    return StateStore(directory, None).artifact_sha256s()


def _sha256s(document: dict) -> set[str]:
    """Every string under a "sha256" key, at any depth: read this way, a file whose shape
    another contract version changed still keeps its artifacts."""
    found, pending = set(), [document]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "sha256" and isinstance(item, str):
                    found.add(item)
                else:
                    pending.append(item)
        elif isinstance(value, list):
            pending.extend(value)
    return found


def _check_ownership(path: Path, status: os.stat_result) -> None:
    """The file is one this worker's user wrote and no one else could have changed."""
    if not stat.S_ISREG(status.st_mode):
        raise PersistedStateRefused(f"{path} is not a regular file")
    if status.st_uid != os.geteuid():
        raise PersistedStateRefused(f"{path} belongs to uid {status.st_uid}, not to this worker's user (uid {os.geteuid()})")
    if status.st_mode & 0o022:
        raise PersistedStateRefused(f"{path} is writable by other users (mode {stat.S_IMODE(status.st_mode):o})")
    directory = path.parent.stat()
    if directory.st_mode & stat.S_IWOTH and not directory.st_mode & stat.S_ISVTX:
        raise PersistedStateRefused(f"{path.parent} is writable by every user: anyone could have put {path.name} there")


def _fsync_directory(directory: Path) -> None:
    """The rename itself survives a power cut only once its directory is synced."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
