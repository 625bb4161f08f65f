"""Which worker process a worker id belongs to.

Every worker holds the same token, so the token alone let any holder report and ack as
any worker id: an audit made a drill pass for a frozen worker by acking in its name.
Each worker now sends a key of its own with every report and ack (the header
``serving.contract.WORKER_KEY_HEADER``; made at start, kept in its cache directory when
its id is fixed by ``SERVING_WORKER_ID``). The first report with a key claims the id for
that key (its sha256 is kept); from then on a report or ack under that id without that
key is refused, 403, even once the worker is gone: an id is free again only when the
console forgets the worker (retention, ``WORKER_FORGET_AFTER_S``, or
``manage.py forget_worker``). A report without any key is accepted only for an id no key
has claimed (a worker of an earlier version, during an upgrade).
"""

from __future__ import annotations

import hashlib
import hmac

from registry.models import Worker

SHOWN_ID_CHARS = 40


class KeyRefused(Exception):
    """A report or ack under an id another key holds (answered with 403)."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def check(worker: Worker | None, worker_id: str, key: str | None) -> None:
    """KeyRefused unless ``key`` may speak for ``worker_id`` (whose row is ``worker``).
    An empty key is no key: it claims nothing and speaks for no claimed id."""
    key = key or None
    if worker is None or not worker.key_digest:
        return
    if key is None or not hmac.compare_digest(digest(key), worker.key_digest):
        said = "without a worker key" if key is None else "with another worker key"
        raise KeyRefused(
            f"worker id {worker_id[:SHOWN_ID_CHARS]!r} belongs to the worker process that first reported under it; this came "
            f"{said}. Two workers may not share an id: the id is free again once the console forgets that worker "
            "(WORKER_FORGET_AFTER_S, or `manage.py forget_worker ID`)"
        )


def claimed(worker: Worker | None, key: str | None) -> dict:
    """The field a report sets: the key's digest when it claims an unclaimed id."""
    if not key or (worker is not None and worker.key_digest):
        return {}
    return {"key_digest": digest(key)}
