"""The content-addressed artifact store: ``ARTIFACT_ROOT/sha256/ab/abcdef…``.

Same bytes, same path, one copy. Bytes first land in ``ARTIFACT_ROOT/tmp`` (the same
file system, so the final move is an atomic rename) while they are hashed and counted.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from django.conf import settings

CHUNK_BYTES = 1024 * 1024


class UploadTooLarge(Exception):
    def __init__(self, limit_bytes: int):
        super().__init__(f"the artifact is larger than the limit of {limit_bytes} bytes (MAX_UPLOAD_BYTES)")
        self.limit_bytes = limit_bytes


@dataclass(frozen=True)
class StagedArtifact:
    path: Path
    sha256: str
    size_bytes: int


def root() -> Path:
    return Path(settings.ARTIFACT_ROOT)


def tmp_dir() -> Path:
    path = root() / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def path_for(sha256: str) -> Path:
    return root() / "sha256" / sha256[:2] / sha256


def exists(sha256: str) -> bool:
    return path_for(sha256).is_file()


class StagingWriter:
    """Writes chunks to a temporary file in the store, hashing and enforcing the limit."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self._hash = hashlib.sha256()
        handle, name = tempfile.mkstemp(dir=tmp_dir(), suffix=".part")
        self.path = Path(name)
        self._file = os.fdopen(handle, "wb")

    def write(self, chunk: bytes) -> None:
        self.size_bytes += len(chunk)
        if self.size_bytes > self.max_bytes:
            self.abort()
            raise UploadTooLarge(self.max_bytes)
        self._hash.update(chunk)
        self._file.write(chunk)

    def finish(self) -> StagedArtifact:
        self._file.close()
        return StagedArtifact(self.path, self._hash.hexdigest(), self.size_bytes)

    def abort(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


def stage_stream(source: BinaryIO, max_bytes: int | None = None) -> StagedArtifact:
    writer = StagingWriter(settings.MAX_UPLOAD_BYTES if max_bytes is None else max_bytes)
    try:
        while chunk := source.read(CHUNK_BYTES):
            writer.write(chunk)
    except BaseException:
        writer.abort()  # idempotent: a refused write has aborted already
        raise
    return writer.finish()


def commit(staged: StagedArtifact) -> bool:
    """Move staged bytes into the store; True when this created the stored file."""
    target = path_for(staged.sha256)
    if target.is_file():
        staged.path.unlink(missing_ok=True)
        # Stored again now: retention takes a file older than its version's archive for one
        # an outage left behind, and this one may be about to get a row of its own.
        os.utime(target)
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged.path, target)
    return True


def discard(staged: StagedArtifact) -> None:
    staged.path.unlink(missing_ok=True)


def delete(sha256: str) -> None:
    path_for(sha256).unlink(missing_ok=True)


def sweep_staging(max_age_s: float, *, now: float | None = None) -> int:
    """Delete staged files nobody has written to for ``max_age_s`` (a process killed
    mid-upload leaves them; live uploads write, or are inspected, well within that).
    Only ``tmp/`` is swept: stored artifacts are never touched. Returns how many went."""
    cutoff = (time.time() if now is None else now) - max_age_s
    removed = 0
    for path in tmp_dir().iterdir():
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:
            pass  # its upload finished or another sweep got there first
    return removed


def sweep_stale_staging() -> int:
    """The periodic sweep (Celery beat, and at ``runstack`` start), with the setting."""
    # Never younger than twice the inspection timeout: a staged file is not written to
    # while it is inspected, and must not vanish under its inspection.
    return sweep_staging(max(settings.STAGING_MAX_AGE_S, 2 * settings.INSPECTION_TIMEOUT_S))
