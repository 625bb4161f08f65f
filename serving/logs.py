"""One JSON object per log line for every worker process, whoever started it.

A line is ``{"ts", "level", "logger", ...}`` plus either the fields of a structured
record (a message that is itself a JSON object, such as
``{"event": "push_refused", "reason": …}``) or ``"message"`` for a plain one, and
``"exc"`` when the record carries an exception. ``ts`` is ISO 8601 in UTC with
milliseconds. Log shippers then parse every line the same way, and grep still works.
A warning a client can cause once per request is held to a few lines a window
(`serving.log_throttle`); a line after such a pause says how many were held back
(``"suppressed"``).

`configure_logging` replaces whatever configured the root logger before (Django's
``LOGGING`` under ``manage.py serve``, uvicorn's own handlers), since otherwise the
first configuration wins and the worker's lines lose their time and level.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

import orjson

from serving.log_throttle import RepeatThrottle

RESERVED_KEYS = ("ts", "level", "logger")
# Loggers whose own handlers (uvicorn's, Django's) would print a second, differently shaped line.
FOREIGN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "django", "django.server", "django.request")
QUIET_LOGGERS = {"httpx": logging.WARNING, "httpcore": logging.WARNING}  # one line per control-plane call is noise


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": _timestamp(record.created), "level": record.levelname.lower(), "logger": record.name}
        message = record.getMessage()
        fields = _structured(message)
        if fields is None:
            line["message"] = message
        else:
            line.update((key, value) for key, value in fields.items() if key not in RESERVED_KEYS)
        suppressed = getattr(record, "suppressed", 0)
        if suppressed:
            line["suppressed"] = suppressed  # lines like this one held back before it (serving.log_throttle)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        # json's ", " and ": " separators: the lines read as the JSON people grep for.
        return json.dumps(line, default=str, ensure_ascii=False)


def _timestamp(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _structured(message: str) -> dict | None:
    """The fields of a message that is a JSON object, else None."""
    if not message.startswith("{"):
        return None
    try:
        fields = orjson.loads(message)
    except orjson.JSONDecodeError:
        return None
    return fields if isinstance(fields, dict) else None


def event(name: str, **fields) -> str:
    """A structured log message: ``logger.warning(event("push_refused", reason=…))``."""
    return orjson.dumps({"event": name, **fields}, default=str).decode()


def configure_logging(level: str, stream=None) -> logging.Handler:
    """Route every record of this process through one JSON handler on ``stream`` (stderr)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RepeatThrottle())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in FOREIGN_LOGGERS:
        foreign = logging.getLogger(name)
        foreign.handlers.clear()
        foreign.propagate = True
        foreign.setLevel(logging.NOTSET)  # the worker's level, until uvicorn sets the same one
    for name, quiet_level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(quiet_level)
    logging.captureWarnings(True)
    return handler
