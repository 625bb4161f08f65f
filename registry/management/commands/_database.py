"""What a command that uses the database checks before anything else: that the database
answers, and that its tables are there. A mistyped DATA_DIR is a new, empty SQLite
database, and without this the first query said "no such table" in a traceback.
(Its name starts with "_": Django does not take it for a command.)"""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor


def require_migrated_database(alias: str = DEFAULT_DB_ALIAS) -> None:
    connection = connections[alias]
    where = _where(connection.settings_dict)
    try:
        executor = MigrationExecutor(connection)
        unapplied = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise CommandError(f"cannot reach the database ({where}): {reason}") from None
    if unapplied:
        raise CommandError(f"the database ({where}) lacks {len(unapplied)} migration(s): run `manage.py migrate` first "
                           "(or check DATA_DIR and DATABASE_URL: is this the installation you meant?)")


def _where(settings_dict: dict) -> str:
    """The database, for people, without its password."""
    if "sqlite" in settings_dict["ENGINE"]:
        return f"SQLite {settings_dict['NAME']}"
    host = settings_dict.get("HOST") or "localhost"
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    return f"{host}{port}/{settings_dict.get('NAME', '')}"
