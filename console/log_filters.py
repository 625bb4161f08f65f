"""Log filters of the console's own (see LOGGING in settings.py)."""

from __future__ import annotations

import logging


class SecurityWithoutTraceback(logging.Filter):
    """Django logs a SuspiciousOperation (a Host header not in ALLOWED_HOSTS, a tampered
    session) with its traceback: Django's own frames, the same every time, around the
    words a client chose, printed twice (an audit: 34 KB a request with an 8,000-character
    Host). The message alone says what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("django.security.") and record.exc_info:
            record.exc_info = record.exc_text = None
        return True
