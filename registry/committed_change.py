"""A request that has committed a change says so, for the answer an outage cuts short.

Once a change is committed, the rest of its request still reads the database: what to
answer, the session's message. Should the database fail then, the 503 that
``console.outage`` would answer invites a retry, and a retry would make the change twice.
A view marks its request as soon as its change is committed; the outage's answer then
says the change was made.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from django.db import DatabaseError

from registry.db_unavailable import is_database_unavailable, is_lock_timeout

ATTRIBUTE = "committed_change"


def mark_committed(request, change: str) -> None:
    """``change``, in words (``"iris: generation 12"``), is committed by ``request``."""
    setattr(getattr(request, "_request", request), ATTRIBUTE, change)  # DRF's Request wraps Django's


def committed_change(request) -> str | None:
    return getattr(getattr(request, "_request", request), ATTRIBUTE, None)


# A change whose COMMIT failed with the connection: the server may have written it before
# the connection went (psycopg raises the same error either way), so neither "made" nor
# "retry" is true. The action notes its change inside the transaction; ``committing``
# turns a lost connection after that note into "in doubt" on the request.
IN_DOUBT_ATTRIBUTE = "change_in_doubt"
_pending = threading.local()


def note_pending(change: str) -> None:
    """Inside a change's transaction, once its rows are written: what a failed COMMIT would leave in doubt."""
    _pending.change = change


@contextmanager
def committing(request):
    """Around a call that commits one change (its view's act)."""
    _pending.change = None
    try:
        yield
    except DatabaseError as error:
        change = getattr(_pending, "change", None)
        # A lock wait that timed out is a statement before the COMMIT, never the COMMIT itself.
        if change and is_database_unavailable(error) and not is_lock_timeout(error):
            setattr(getattr(request, "_request", request), IN_DOUBT_ATTRIBUTE, change)
        raise
    finally:
        _pending.change = None


def change_in_doubt(request) -> str | None:
    return getattr(getattr(request, "_request", request), IN_DOUBT_ATTRIBUTE, None)
