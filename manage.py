#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.core.management import execute_from_command_line
    from django.db import DatabaseError

    from serving.env import SettingError

    try:
        execute_from_command_line(sys.argv)
    except SettingError as error:  # a bad value in the environment: the sentence names it, a traceback would bury it
        sys.exit(f"manage.py: {error}")
    except DatabaseError as error:
        if not _no_such_table(error):
            raise
        sys.exit(f"manage.py: {_unmigrated(error)}")


def _no_such_table(error: Exception) -> bool:
    text = str(error)
    return text.startswith("no such table") or ("relation" in text and "does not exist" in text)


def _unmigrated(error: Exception) -> str:
    """What a command run against an empty database is told: most often it was meant for
    the stack's database, started with another DATA_DIR or DATABASE_URL."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    where = f"the SQLite database {database['NAME']}" if database["ENGINE"].endswith("sqlite3") else (
        f"the database {database.get('NAME')!r} on {database.get('HOST') or 'localhost'}")  # never the URL: it may hold a password
    first_line = (str(error).strip().splitlines() or [""])[0]
    return (f"{where} lacks a table this command needs ({first_line}): it is not the stack's database, or not migrated to "
            "this version; set DATA_DIR (or DATABASE_URL) to the one the stack runs with, or run `manage.py migrate`")


if __name__ == "__main__":
    main()
