"""What the console learns of a stored artifact's bytes as it serves them.

The store is content-addressed, but a disk or a hand can change a file after its upload.
Workers check every download against the version's sha256 and refuse it, then try again
at each reconcile (every 3 s): each worker downloaded a broken file whole, again and
again, and its ack said only "sha256 mismatch", leaving the operator to guess whether the
network, the worker or the store was at fault. The console now hashes what it streams,
at no extra read; once a whole stream did not match, later requests for that file get a
503 saying the store's copy changed, until the file changes again (its inode, size,
modification or status-change time: a write, or a copy that sets the times back, moves the
last). Nothing is hashed before a first stream: a 2 GiB artifact would hold a request for
seconds.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

Key = tuple[int, int, int, int]
# path → the stat key of the file whose whole stream did not match its sha256
_mismatched: dict[str, Key] = {}


def stat_key(status: os.stat_result) -> Key:
    return status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns


def known_mismatch(path: Path) -> bool:
    """The file at ``path``, unchanged since, did not match its sha256 when last streamed whole."""
    key = _mismatched.get(str(path))
    try:
        return key is not None and key == stat_key(path.stat())
    except OSError:
        return False


def stored_file_problem(path: Path, size_bytes: int | None = None) -> str | None:
    """Why no worker can load the stored file at ``path`` whatever it tries: it is missing,
    its size is not the ``size_bytes`` uploaded (one stat: a file cut short or replaced,
    where a changed byte shows only once a download is hashed), or this console saw it no
    longer match its sha256. None when nothing is known wrong."""
    try:
        status = path.stat()
    except OSError:  # gone between the checks, or unreadable: as is_file() said
        status = None
    if status is None or not stat.S_ISREG(status.st_mode):
        return "its stored file is missing from the artifact store, so no worker can download it"
    size = status.st_size
    if size_bytes is not None and size != size_bytes:
        return f"its stored file changed after its upload ({size} bytes, not the {size_bytes} uploaded)"
    if known_mismatch(path) or path.is_symlink():  # a link is never served (registry/api/streams.py)
        return "its stored file changed after its upload (the console's last download of it did not match its sha256)"
    return None


def checked_as_streamed(chunks: Iterable[bytes], path: Path, sha256: str, key: Key) -> Iterator[bytes]:
    """``chunks`` (of the file opened at ``path`` whose stat key is ``key``) as they are,
    remembering whether all of them matched ``sha256`` (a stream its client left early
    proves nothing)."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
        yield chunk
    if digest.hexdigest() == sha256:
        if _mismatched.get(str(path)) == key:  # not a mark another file at the path earned meanwhile
            del _mismatched[str(path)]
    elif _mismatched.get(str(path)) != key:
        _mismatched[str(path)] = key
        logger.error("the stored artifact %s does not match its sha256 %s… (it is %s…): the file changed after its upload; "
                     "workers refuse it", path, sha256[:12], digest.hexdigest()[:12])
