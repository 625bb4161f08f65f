"""Taking a row lock within DATABASE_LOCK_TIMEOUT_S in all, however many wait for it.

PostgreSQL's ``lock_timeout`` (set on every connection) bounds each single wait, but
changes that queue for one row wait twice: first behind the change ahead of them, then
on the holder. A fault run saw 19-20 s answers under a 10 s setting. The statement that
takes the lock runs under a ``statement_timeout`` of the setting, so its whole wait is
bounded, still first come, first served; past it, ``LockWaitTimeout``, answered like
``lock_timeout`` (console/outage.py). SQLite takes no row locks: its writers queue on
``SQLITE_BUSY_TIMEOUT_S``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import OperationalError, connection

from registry.db_unavailable import LockWaitTimeout

QUERY_CANCELED_SQLSTATE = "57014"


def locked(queryset, **lookup):
    """``queryset.select_for_update().get(**lookup)``, waiting DATABASE_LOCK_TIMEOUT_S at most."""
    if connection.vendor != "postgresql" or not settings.DATABASE_LOCK_TIMEOUT_S:
        return queryset.select_for_update().get(**lookup)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout')")
        before = cursor.fetchone()[0]
        # is_local: for this transaction only, and set back below once the lock is held.
        cursor.execute("SELECT set_config('statement_timeout', %s, true)", [f"{round(settings.DATABASE_LOCK_TIMEOUT_S * 1000)}ms"])
    try:
        row = queryset.select_for_update().get(**lookup)
    except OperationalError as error:
        if getattr(error.__cause__, "sqlstate", None) == QUERY_CANCELED_SQLSTATE:
            raise LockWaitTimeout(f"waited {settings.DATABASE_LOCK_TIMEOUT_S:g} s for a row lock") from error
        raise
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('statement_timeout', %s, true)", [before])
    return row
