"""The content-addressed artifact store: ``ARTIFACT_ROOT/sha256/ab/abcdef…``.

Same bytes, same path, one copy. Bytes first land in ``ARTIFACT_ROOT/tmp`` (the same
file system, so the final move is an atomic rename) while they are hashed and counted.
A write the file system refuses (a full disk) removes the staged file before the error
goes on: nothing half-written stays.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from django.conf import settings

CHUNK_BYTES = 1024 * 1024
SHA256_NAME = re.compile(r"[0-9a-f]{64}")
# A stored file ``delete_stale`` has moved aside while it decides; a sweep killed midway
# leaves it, and the next one decides again.
ASIDE_SUFFIX = ".deleting"


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


def open_unfollowed(path: Path) -> BinaryIO:
    """``path`` opened for reading; OSError (ELOOP) when it is a symbolic link, which is
    never followed: one put in the store in place of an artifact had its target (another
    model, /etc/passwd in an attack) read as the artifact's bytes."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")

# What a full disk (or a user's quota) raises under an upload: the artifact store's file
# system, DATA_DIR's, is the only one a request writes to.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in FULL_ERRNOS


def is_too_large(error: BaseException) -> bool:
    """A file larger than the console may write (EFBIG): its file size limit (``ulimit -f``,
    systemd's ``LimitFSIZE=``, a container's) or the largest file its file system holds
    (FAT's 4 GiB). Python ignores SIGXFSZ, so the write raises; every upload past the limit
    was a bare 500 "Internal Server Error" (a 4 MB model under a 3 MB limit), and no retry mends it."""
    return isinstance(error, OSError) and error.errno == errno.EFBIG


def too_large_message(what: str) -> str:
    """What a 507 for EFBIG says: ``what`` could not keep a file this large, and why that may be."""
    limit = file_size_limit()
    cause = f"this console's processes may write files of up to {limit} bytes (ulimit -f)" if limit is not None else \
        "the file system's largest file is smaller"
    return f"{what} cannot keep a file this large: {os.strerror(errno.EFBIG).lower()} ({cause}); nothing was kept"


def file_size_limit() -> int | None:
    """The process's file size limit in bytes (RLIMIT_FSIZE); None when there is none."""
    import resource  # POSIX only, as the console is

    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


# ...and what a store that will not take a write raises: a read-only mount, a directory
# whose owner or flags changed. Both answered 500 "internal error", naming nothing.
REFUSING_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def write_refusal(error: BaseException) -> tuple[int, str] | None:
    """The status and words of an upload the store could not keep (507 full or too large, 503 refused),
    or None when ``error`` is neither. A request writes only under ARTIFACT_ROOT (models,
    job inputs, data sets and the upload staging directory), so that is what it names."""
    if is_full(error):
        return 507, full_message(error)
    if is_too_large(error):
        return 507, too_large_message("the artifact store")
    if isinstance(error, OSError) and error.errno in REFUSING_ERRNOS:
        return 503, (f"the artifact store refused the write: {os.strerror(error.errno).lower()}; nothing was kept. "
                     "ARTIFACT_ROOT must be mounted read-write and writable by the console's user; send it again once it is")
    return None


def full_message(error: OSError) -> str:
    """What a 507 says: the store is full, how much is free where the write failed (a part
    of the store may be a volume of its own), and that nothing was kept."""
    folder = _failed_folder(error)
    free = free_bytes(folder)
    where = "ARTIFACT_ROOT" if folder == root() else f"ARTIFACT_ROOT/{folder.relative_to(root()).parts[0]}"
    room = "" if free is None else f" ({free} bytes free in {where})"
    return f"the artifact store is full: {os.strerror(error.errno).lower()}{room}; nothing was kept: send it again once space is freed"


def _failed_folder(error: OSError) -> Path:
    """The part of the store the failed write was in (its top folder), else the store."""
    try:
        # Not resolved: a part mounted elsewhere is reached through its name under the store.
        named = Path(os.path.abspath(error.filename)).relative_to(os.path.abspath(root())) if error.filename else None
    except (ValueError, TypeError):
        named = None
    return root() / named.parts[0] if named is not None and named.parts else root()


def free_bytes(folder: Path | None = None) -> int | None:
    """Bytes the file system of ``folder`` (the store's) has free for us; None when it cannot say."""
    try:
        return shutil.disk_usage(folder or root()).free
    except OSError:
        return None


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
        try:
            self._file.write(chunk)
        except OSError:
            self.abort()  # a full disk: its caller answers, and no part of the file stays
            raise

    def finish(self) -> StagedArtifact:
        try:
            self._file.close()  # the last buffered bytes may meet a full disk too
        except OSError:
            self.abort()
            raise
        return StagedArtifact(self.path, self._hash.hexdigest(), self.size_bytes)

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()  # on a full disk its flush fails again; the file goes all the same
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


# A copy on its way into a part of the store on another file system (``brought_to``):
# hidden, and swept by ``sweep_stale_staging`` when a process died before renaming it.
PARTIAL_SUFFIX = ".partial"


def move_into(staged: Path, target: Path) -> None:
    """``os.replace(staged, target)``, also where ``target`` is on another file system than
    ``ARTIFACT_ROOT/tmp`` (an operator's volume mounted at ``…/jobs``, ``…/datasets`` or
    ``…/sha256``: a rename there was EXDEV, a 500)."""
    beside = brought_to(staged, target.parent)
    try:
        os.replace(beside, target)
    except BaseException:
        beside.unlink(missing_ok=True)
        raise
    _sync_folder(target.parent)


def brought_to(staged: Path, folder: Path) -> Path:
    """``staged`` moved into ``folder`` under a hidden name, for a rename from there that
    cannot cross file systems: renamed when ``folder`` is on the staging file system, else
    copied and synced (a copy the disk refuses is removed before the error goes on, named
    by where it failed), so no reader of the final name ever sees part of the bytes. Slow
    for a large file on another file system: call it before taking a lock, not under one."""
    folder.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=folder, prefix=".incoming-", suffix=PARTIAL_SUFFIX)
    beside = Path(name)
    try:
        try:
            os.replace(staged, beside)
            return beside
        except OSError as error:
            if error.errno != errno.EXDEV:
                raise
        with open(staged, "rb") as source:
            while chunk := source.read(CHUNK_BYTES):
                view = memoryview(chunk)
                while view:  # os.write may write less than it was given
                    view = view[os.write(descriptor, view):]
        os.fsync(descriptor)
    except BaseException as error:
        beside.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(beside)  # a full volume is named by where the write failed (full_message)
        raise
    finally:
        os.close(descriptor)
    staged.unlink(missing_ok=True)
    return beside


def _sync_folder(folder: Path) -> None:
    """The rename into ``folder`` made durable before the staged copy is gone for good."""
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def commit(staged: StagedArtifact) -> bool:
    """Move staged bytes into the store; True when this created the stored file."""
    target = path_for(staged.sha256)
    try:
        # Stored again now, before its row commits: retention takes an old file that no row
        # names, or one older than its version's archive, for one left behind.
        os.utime(target)
    except FileNotFoundError:  # not there, or moved aside by delete_stale: this copy is fresh
        target.parent.mkdir(parents=True, exist_ok=True)
        move_into(staged.path, target)
        return True
    staged.path.unlink(missing_ok=True)
    return False


def discard(staged: StagedArtifact) -> None:
    staged.path.unlink(missing_ok=True)


def stored_before(cutoff_s: float) -> Iterator[list[str]]:
    """The sha256s of the stored files last stored before ``cutoff_s`` (a time.time()),
    one list per folder of the store (at most 256), files left aside included."""
    base = root() / "sha256"
    folders = sorted(path for path in base.iterdir() if path.is_dir()) if base.is_dir() else []
    for folder in folders:
        found = {name for name in (_stored_name(path, cutoff_s) for path in folder.iterdir()) if name is not None}
        if found:
            yield sorted(found)


def _stored_name(path: Path, cutoff_s: float) -> str | None:
    name = path.name.removesuffix(ASIDE_SUFFIX)
    if not SHA256_NAME.fullmatch(name):
        return None  # not a file this store wrote: not ours to judge
    try:
        return name if path.is_file() and path.stat().st_mtime < cutoff_s else None
    except FileNotFoundError:
        return None


def delete_stale(sha256: str, cutoff_s: float, is_needed: Callable[[], bool]) -> bool:
    """Delete the stored file unless it was stored again since ``cutoff_s`` or
    ``is_needed()`` says so; True when it went. The file is moved aside before either is
    checked, so neither answer can be overtaken: an upload of these bytes that comes
    after the move finds nothing to refresh (``commit``) and stores a copy of its own."""
    target, aside = path_for(sha256), _aside_path(sha256)
    with contextlib.suppress(FileNotFoundError):  # gone, or already aside (a sweep killed midway)
        os.replace(target, aside)
    try:
        stored_again = aside.stat().st_mtime >= cutoff_s
    except FileNotFoundError:
        return False
    try:
        keep = stored_again or is_needed()
    except BaseException:
        put_back(sha256)  # no answer (the database is down): the file stays
        raise
    if keep:
        put_back(sha256)
        return False
    aside.unlink(missing_ok=True)
    return True


def put_back(sha256: str) -> None:
    """Return a file ``delete_stale`` moved aside to its place, if one is aside."""
    with contextlib.suppress(FileNotFoundError):  # none, or another sweep put it back
        os.replace(_aside_path(sha256), path_for(sha256))  # the same bytes as any copy stored meanwhile


def _aside_path(sha256: str) -> Path:
    return path_for(sha256).with_name(sha256 + ASIDE_SUFFIX)


def sweep_staging(max_age_s: float, *, now: float | None = None) -> int:
    """Delete staged files nobody has written to for ``max_age_s`` (a process killed
    mid-upload leaves them; live uploads write, or are inspected, well within that), and
    copies ``brought_to`` left on their way into the store's parts. Only those are swept:
    stored artifacts are never touched. Returns how many went."""
    cutoff = (time.time() if now is None else now) - max_age_s
    removed = 0
    for path in [*tmp_dir().iterdir(), *_partials()]:
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:
            pass  # its upload finished or another sweep got there first
    return removed


def _partials() -> list[Path]:
    found = [path for folder in (root() / "jobs", root() / "datasets") for path in folder.glob(f".incoming-*{PARTIAL_SUFFIX}")]
    return found + list((root() / "sha256").glob(f"*/.incoming-*{PARTIAL_SUFFIX}"))


def sweep_stale_staging() -> int:
    """The periodic sweep (Celery beat, and at ``runstack`` start), with the setting."""
    # Never younger than twice the inspection timeout: a staged file is not written to
    # while it is inspected, and must not vanish under its inspection.
    return sweep_staging(max(settings.STAGING_MAX_AGE_S, 2 * settings.INSPECTION_TIMEOUT_S))
