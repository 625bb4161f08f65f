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
import secrets
from pathlib import Path


def worker_key(worker_id: str, cache_dir: str | Path, *, fixed_id: bool) -> str:
    if not fixed_id:
        return secrets.token_urlsafe(32)
    path = Path(cache_dir) / f"worker-key-{hashlib.sha256(worker_id.encode()).hexdigest()[:16]}"
    try:
        kept = path.read_text().strip()
        if kept:
            return kept
    except FileNotFoundError:
        pass
    key = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process with this id made it first: its key is ours
        return path.read_text().strip()
    with os.fdopen(descriptor, "w") as out:
        out.write(key)
    return key
