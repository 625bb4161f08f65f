"""Which database errors mean "the database cannot do this console's work now", shared by
the console's 503 (console/outage.py), its session store and the drills that outlast an
outage (registry/actions/drills.py), so all three judge an error the same way.

Unreachable: OperationalError (cannot connect, connection lost, server shutting down,
timeouts) and InterfaceError (the connection object is already closed: a request after a
loss). Read-only: the database answers but refuses writes, which every sign-in, report and
change makes: PostgreSQL's SQLSTATE 25006 (a hot standby after a failover, writes switched
off) or SQLite's SQLITE_READONLY (a read-only file, ``PRAGMA query_only``). Full: the
disk under the database has no room for a write (``is_disk_full``).
"""

from __future__ import annotations

import sqlite3

from django.db import DatabaseError, InterfaceError, OperationalError

UNREACHABLE_ERRORS = (OperationalError, InterfaceError)
READ_ONLY_SQLSTATE = "25006"  # read_only_sql_transaction


def is_read_only(error: BaseException | None) -> bool:
    """A write refused because the database is read-only (Django wraps the driver's error)."""
    if not isinstance(error, DatabaseError):
        return False
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) == READ_ONLY_SQLSTATE or getattr(cause, "sqlite_errorcode", None) == sqlite3.SQLITE_READONLY


LOCK_TIMEOUT_SQLSTATE = "55P03"  # lock_not_available: DATABASE_LOCK_TIMEOUT_S passed


class LockWaitTimeout(OperationalError):
    """A row lock not taken within DATABASE_LOCK_TIMEOUT_S in all (registry/row_lock.py)."""


def is_lock_timeout(error: BaseException | None) -> bool:
    """A lock this work needed was held by another session for longer than
    DATABASE_LOCK_TIMEOUT_S (an OperationalError, so unavailable too: the same 503 and retry)."""
    if isinstance(error, LockWaitTimeout):
        return True
    return isinstance(error, DatabaseError) and getattr(error.__cause__, "sqlstate", None) == LOCK_TIMEOUT_SQLSTATE


# SQLSTATEs of a server going away: class 08 (connection exception), and an administrator's
# or a crash's shutdown, or a server still starting (57P01-57P03).
CONNECTION_LOST_SQLSTATES = ("57P01", "57P02", "57P03")


def is_connection_lost(error: BaseException | None) -> bool:
    """The database went away (or was never reached): not a lock, a timeout, a full disk
    or a deadlock, which a database that still answers raises as OperationalError too.
    A driver error with no SQLSTATE is one the client raised itself: a lost connection."""
    if isinstance(error, InterfaceError):
        return True
    if not isinstance(error, OperationalError) or isinstance(error, LockWaitTimeout):
        return False
    cause = error.__cause__
    if isinstance(cause, sqlite3.Error):
        return False  # a file database cannot go away: "database is locked", a full disk
    sqlstate = getattr(cause, "sqlstate", None)
    return sqlstate is None or sqlstate.startswith("08") or sqlstate in CONNECTION_LOST_SQLSTATES


DISK_FULL_SQLSTATE = "53100"  # disk_full


def is_disk_full(error: BaseException | None) -> bool:
    """A write refused for want of room on the database's disk: PostgreSQL's 53100,
    SQLite's SQLITE_FULL. Unavailable too (drills and jobs wait through it), but no wait
    alone mends it: the console says so (console/outage.py)."""
    if not isinstance(error, DatabaseError):
        return False
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) == DISK_FULL_SQLSTATE or getattr(cause, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


def past_file_size_limit(error: BaseException | None) -> int | None:
    """The file size limit (bytes) a write of SQLite's database or journal reached, when
    ``error`` is SQLite's write error (SQLITE_IOERR_WRITE: SQLite names no errno, and
    EFBIG is not SQLITE_FULL to it) in a console run under one (``ulimit -f``, systemd's
    ``LimitFSIZE=``); else None. Every change was a 503 "the database is unavailable;
    retry in 5 s" while /readyz said the database was ok, and no retry mends it."""
    if not isinstance(error, DatabaseError) or getattr(error.__cause__, "sqlite_errorcode", None) != sqlite3.SQLITE_IOERR_WRITE:
        return None
    from registry.artifacts.storage import file_size_limit  # settings-bound module; this one is imported early

    return file_size_limit()


def is_database_unavailable(error: BaseException | None) -> bool:
    return isinstance(error, UNREACHABLE_ERRORS) or is_read_only(error)


def missing_schema(error: BaseException | None) -> str | None:
    """SQLite's "no such table" or "no such column" (an OperationalError: "unavailable" to
    the rules above): a database never migrated, or not the console's. Its first line, to
    say so instead of "the database is unavailable" (a Celery started by hand on a fresh
    DATA_DIR said that every few seconds)."""
    if not isinstance(error, OperationalError) or not isinstance(error.__cause__, sqlite3.OperationalError):
        return None
    words = (str(error).strip().splitlines() or [""])[0]
    return words if words.startswith(("no such table", "no such column")) else None
