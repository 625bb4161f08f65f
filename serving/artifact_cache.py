"""What is removed from the worker's artifact cache, and when.

Artifacts are downloaded into SERVING_CACHE_DIR as ``<sha256>.onnx`` through a
``<sha256>.onnx.<random>.part`` file (serving/console_client.py). In Kubernetes the
cache is an emptyDir that survives container restarts, OOM kills included, and the pod
is evicted once it passes its sizeLimit; so two things must not pile up in it:

- A download cut by a kill leaves its ``.part``. The download holds an exclusive lock
  (flock) on its ``.part`` while it writes; the kernel drops the lock with the process,
  however it dies. At start, before any download of its own, a worker removes every
  ``.part`` that no one holds: two workers started by hand on one host share
  ``$DATA_DIR/serving-cache``, and the other's live download is never cut, however slow.
- Artifacts of versions no longer served. After each apply that changed the loaded
  versions, the worker removes them (``evict_unused_artifacts``).

What eviction never removes: an artifact of a loaded version (routed or warm: a rollback
target is kept warm by the console's state, so a rollback never waits for a download);
one the persisted state names (serving/state_store.py: a restart while the console is
down loads those from here, and the file is written only after the apply that follows);
the KEEP_RECENT_ARTIFACTS used last; and any used within MIN_IDLE_S (another worker
sharing the directory may be between verifying it and reading it). "Used" is the file's
mtime: set when its download ends, and again on every cache hit (``mark_used``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import stat
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from serving.logs import event
from serving.state_store import persisted_artifacts

logger = logging.getLogger("serving.artifact_cache")

PART_SUFFIX = ".part"
ARTIFACT_NAME = re.compile(r"[0-9a-f]{64}\.onnx")
KEEP_RECENT_ARTIFACTS = 3
MIN_IDLE_S = 600.0
PARTIAL_ATTEMPTS = 3
HELD = -1  # _remove_if_unheld: a live download holds it


@dataclass
class Sweep:
    """What one pass removed, and what it had to leave."""

    removed_files: int = 0
    removed_bytes: int = 0
    kept_files: int = 0


def open_partial(dest: Path) -> tuple[int, Path]:
    """A new ``<dest>.<random>.part`` (created exclusively, mode 0600) and its descriptor,
    locked for as long as the descriptor is open: the lock tells a start-up sweep a live
    download from a dead one."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(PARTIAL_ATTEMPTS):
        descriptor, name = tempfile.mkstemp(dir=dest.parent, prefix=f"{dest.name}.", suffix=PART_SUFFIX)
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        if os.fstat(descriptor).st_nlink:
            return descriptor, Path(name)
        os.close(descriptor)  # a sweep took it between its creation and the lock: another name
    raise OSError(f"cannot create a partial download in {dest.parent}: each one was removed as it was made")


def mark_used(path: Path) -> None:
    """A cache hit: the artifact counts as used now, for eviction."""
    with suppress(OSError):  # a file this user cannot touch is merely evicted sooner
        os.utime(path)


def remove_stale_downloads(cache_dir: str | Path) -> Sweep:
    """Remove every ``.part`` in the cache that no live download holds; one log line when
    there was any. Never raises: a cache it cannot read is left as it is."""
    sweep = Sweep()
    for path in _entries(cache_dir, lambda name: name.endswith(PART_SUFFIX)):
        size = _remove_if_unheld(path)
        if size == HELD:
            sweep.kept_files += 1
        elif size is not None:
            sweep.removed_files, sweep.removed_bytes = sweep.removed_files + 1, sweep.removed_bytes + size
    if sweep.removed_files or sweep.kept_files:
        logger.info(event("stale_downloads_removed", cache_dir=str(cache_dir), files=sweep.removed_files,
                          bytes=sweep.removed_bytes, kept_live=sweep.kept_files))
    return sweep


def evict_unused_artifacts(cache_dir: str | Path, served_sha256s: set[str], *, keep_recent: int = KEEP_RECENT_ARTIFACTS,
                           min_idle_s: float = MIN_IDLE_S) -> Sweep:
    """Remove the cached artifacts neither served nor named by the persisted state, but the
    ``keep_recent`` used last and any used within ``min_idle_s``; one log line when any
    was removed. Never raises: the apply it follows has succeeded."""
    try:
        keep = set(served_sha256s) | persisted_artifacts(cache_dir)
    except OSError as error:  # what the persisted state needs is unknown: remove nothing
        logger.warning(event("artifacts_not_evicted", cache_dir=str(cache_dir), reason=error.strerror))
        return Sweep()
    candidates = []
    for path in _entries(cache_dir, ARTIFACT_NAME.fullmatch):
        with suppress(OSError):
            status = path.stat(follow_symlinks=False)
            if stat.S_ISREG(status.st_mode) and path.name.removesuffix(".onnx") not in keep:
                candidates.append((status.st_mtime, status.st_size, path))
    candidates.sort(reverse=True)  # the most recently used first
    sweep = Sweep(kept_files=min(keep_recent, len(candidates)))
    idle_before = time.time() - min_idle_s
    for used_at, size, path in candidates[keep_recent:]:
        if used_at > idle_before:
            sweep.kept_files += 1
            continue
        try:
            path.unlink()
        except OSError as error:
            logger.warning(event("artifact_not_evicted", path=str(path), reason=error.strerror))
            continue
        sweep.removed_files, sweep.removed_bytes = sweep.removed_files + 1, sweep.removed_bytes + size
    if sweep.removed_files:
        logger.info(event("artifacts_evicted", cache_dir=str(cache_dir), files=sweep.removed_files,
                          bytes=sweep.removed_bytes, kept_unserved=sweep.kept_files))
    return sweep


def _entries(cache_dir: str | Path, wanted) -> list[Path]:
    try:
        with os.scandir(cache_dir) as entries:
            return [Path(entry.path) for entry in entries if wanted(entry.name)]
    except FileNotFoundError:
        return []
    except OSError as error:
        logger.warning(event("artifact_cache_unreadable", cache_dir=str(cache_dir), reason=error.strerror))
        return []


def _remove_if_unheld(path: Path) -> int | None:
    """Unlink a ``.part`` no download holds, holding its lock meanwhile: its size; HELD when
    a live download holds it; None when it is not ours to remove (a link, not a regular
    file) or already gone."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # a link (not ours to follow), or already gone
        return None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            return None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return HELD  # a live download: another worker's sharing this directory
        path.unlink()
        return status.st_size
    except OSError as error:
        logger.warning(event("stale_download_not_removed", path=str(path), reason=error.strerror))
        return None
    finally:
        os.close(descriptor)
