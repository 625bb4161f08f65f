"""This worker's key, sent with every report and ack (``contract.WORKER_KEY_HEADER``):
the console gives a worker id to the first key that reports under it, so another holder
of the shared token cannot report or ack in this worker's name
(registry/fleet/worker_keys.py).

A default id names one process (host, PID, a random suffix), so its key is made at start
and kept in memory. An id fixed by ``SERVING_WORKER_ID`` outlives the process: its key is
kept in the cache directory (0600), so a restarted worker is still the worker its id
names; a worker whose cache directory is lost gets a new key, and the console refuses it
until that id is forgotten (``manage.py forget_worker``)."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from pathlib import Path

MAX_KEY_BYTES = 256
KEY_PATTERN = re.compile(rb"[A-Za-z0-9_-]{32,%d}" % MAX_KEY_BYTES)  # what token_urlsafe makes, 43 characters


def worker_key(worker_id: str, cache_dir: str | Path, *, fixed_id: bool) -> str:
    if not fixed_id:
        return secrets.token_urlsafe(32)
    # Named by a digest of the id: an id is not a path (``../x`` stays in the cache directory).
    path = Path(cache_dir) / f"worker-key-{hashlib.sha256(worker_id.encode()).hexdigest()[:16]}"
    kept = _read(path)
    if kept:
        return kept
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32)
    # Written whole under another name, then linked into place: the key file never exists
    # empty or half-written, and of two processes with this id the first link wins.
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w") as out:
            out.write(key)
        try:
            os.link(temporary, path)
        except FileExistsError:
            kept = _read(path)
            if kept:  # another process with this id made it first: its key is ours
                return kept
            os.replace(temporary, path)  # empty or damaged: left by a crash of an earlier version, or edited
    finally:
        temporary.unlink(missing_ok=True)
    return key


def _read(path: Path) -> str:
    """The kept key, or "" when there is none usable: a key goes out in an HTTP header, so a
    damaged file (empty, not text, too long, a stray character) is replaced like a missing one."""
    try:
        with path.open("rb") as kept:
            raw = kept.read(MAX_KEY_BYTES + 1)
    except FileNotFoundError:
        return ""
    key = raw.strip()
    return key.decode() if KEY_PATTERN.fullmatch(key) else ""
