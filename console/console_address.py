"""Where this installation's console listens, as ``manage.py runstack`` recorded it.

A worker started by hand with ``manage.py serve`` and no ``CONSOLE_URL`` takes the
console's ``CONSOLE_URL`` setting, which falls back on this record: the console this
DATA_DIR belongs to, never whichever console answers on a default port. The record is
kept when the stack stops, so such a worker started during an outage still knows whom
to follow (it serves its persisted state meanwhile).
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_NAME = "console-url"
# The Redis the stack's processes share, so that such a worker also joins the push channel
# (without it, it saw each change only at its next poll, up to 3 s late). Readable by its
# owner alone: the URL carries the Redis password.
REDIS_FILE_NAME = "redis-url"
# And the worker it started (--serving-port): `manage.py demo_traffic` and other commands
# run by hand beside the stack send there, not to the default port.
SERVING_FILE_NAME = "serving-url"
MAX_CHARS = 2000  # a URL; anything longer is not one this command wrote


def record(data_dir: Path, url: str, file_name: str = FILE_NAME) -> None:
    path = Path(data_dir) / file_name
    partial = path.with_suffix(".partial")
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
        file.write(url + "\n")
    os.replace(partial, path)  # a reader sees the old address or the new one, never half of one


def recorded(data_dir: Path, file_name: str = FILE_NAME) -> str:
    """The recorded address, or "" when none was recorded."""
    try:
        with (Path(data_dir) / file_name).open() as file:
            return file.read(MAX_CHARS).strip()
    except (FileNotFoundError, NotADirectoryError):
        return ""
