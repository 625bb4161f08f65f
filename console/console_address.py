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
MAX_CHARS = 2000  # a URL; anything longer is not one this command wrote


def record(data_dir: Path, url: str) -> None:
    path = Path(data_dir) / FILE_NAME
    partial = path.with_suffix(".partial")
    partial.write_text(url + "\n")
    os.replace(partial, path)  # a reader sees the old address or the new one, never half of one


def recorded(data_dir: Path) -> str:
    """The recorded address, or "" when none was recorded."""
    try:
        with (Path(data_dir) / FILE_NAME).open() as file:
            return file.read(MAX_CHARS).strip()
    except (FileNotFoundError, NotADirectoryError):
        return ""
