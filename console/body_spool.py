"""A request body that cannot be spooled is a 507 (``console.handler`` answers it).

Django reads a whole request body into a temporary file (in memory up to
``FILE_UPLOAD_MAX_MEMORY_SIZE``, then in ``TMPDIR``) before any view runs. When that file
system is full the write raises out of the handler, and uvicorn answered a plain-text
500 with a traceback in its log. Here the same failure is a 507 naming the full
directory, sent before any view ran: nothing was read into the store or recorded, and
the spooled part is released with the failed read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from errno import EFBIG

from registry.artifacts.storage import too_large_message


class BodySpoolFull(Exception):
    """The request body's temporary file could not grow: its file system is full, or the
    file reached the console's file size limit (EFBIG)."""

    def __init__(self, errno: int) -> None:
        super().__init__(errno)
        self.errno = errno


def spool_full_message(errno: int) -> str:
    directory = tempfile.gettempdir()
    if errno == EFBIG:  # not full: past the console's file size limit (storage.is_too_large)
        return too_large_message(f"the console's temporary space for request bodies ({directory}, TMPDIR)") + ": send a smaller file, or raise the limit"
    try:
        room = f" ({shutil.disk_usage(directory).free} bytes free)"
    except OSError:
        room = ""
    return (f"the console's temporary space for request bodies ({directory}, TMPDIR) is full: "
            f"{os.strerror(errno).lower()}{room}; nothing was kept: send it again once space is freed")
