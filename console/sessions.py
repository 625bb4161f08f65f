"""Django's database sessions, answering an unavailable database as one.

Django's ``SessionMiddleware`` turns any database error while it saves a session into
``UpdateError`` and then a 400 that says the session was deleted by a concurrent request.
During an outage, or on a read-only database, that is false and the wrong status: here
the database's own error goes on, and ``console.outage`` answers it 503 with Retry-After.
"""

from __future__ import annotations

from django.contrib.sessions.backends import db
from django.contrib.sessions.backends.base import UpdateError

from registry.db_unavailable import is_database_unavailable


class SessionStore(db.SessionStore):
    def save(self, must_create: bool = False) -> None:
        try:
            super().save(must_create)
        except UpdateError as error:
            cause = error.__context__
            if is_database_unavailable(cause):
                raise cause  # with its own cause, the driver's error, which tells what kind
            raise
