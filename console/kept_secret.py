"""A secret generated once and kept in a file, which every process started beside it
reads: the Django key and the worker token, when the environment gives none.

The file appears whole or not at all: the secret is written to a file of its own and
linked into place. Created empty and then written, two processes starting at once on a
fresh DATA_DIR could read it in between, and one refused to start ("DJANGO_SECRET_KEY is
only 0 characters long").
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path


def new_secret() -> str:
    return secrets.token_urlsafe(40)


def kept_secret(path: Path, make: Callable[[], str] = new_secret) -> str:
    """The secret in ``path``; when there is none yet, ``make``'s, kept there first. Of
    processes making one at once, the first to link its file wins and all read that one."""
    if not path.exists():
        _keep(path, make())
    return path.read_text().strip()


def _keep(path: Path, value: str) -> None:
    descriptor, written = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600: never readable by others
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(value)
            file.flush()
            os.fsync(file.fileno())  # on disk before its name: a crash must not leave the name on an empty file
        try:
            os.link(written, path)
        except FileExistsError:  # another process kept its own first: that one holds
            pass
        except OSError:  # a file system without hard links: created exclusively, then written (the old race, there only)
            with contextlib.suppress(FileExistsError), os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
                file.write(value)
    finally:
        os.unlink(written)
