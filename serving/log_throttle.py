"""Log lines a client can cause, bounded: at most `burst` a `window_s` from each place in the code.

A client decides how often some warnings are written: a malformed HTTP request, an
input that makes a batch split, a failed login, a bad Host header. Written once per
request, a flood of such requests fills the disk with the same line: 300 malformed
requests to a worker wrote 300 "Invalid HTTP request received." lines.

`RepeatThrottle` is a `logging.Filter` for a handler. It counts WARNING-and-above
records by the line of code that logged them (path, line number, level): the key space
is the code's, so no input can grow it. The first `burst` records of a window pass;
the rest are dropped and counted, and the first record that passes in a later window
carries the count as `record.suppressed` (the worker's JSON lines show it as the
`"suppressed"` field; `SuppressedFormatter` appends it to a plain line). Records below
WARNING are never held back: an operator who turns on debug asked for every line.

A line can also be long because of what a client sent (a path or Host header of 8,000
characters): the message of a WARNING-and-above record is cut to `MAX_MESSAGE_CHARS`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

BURST = 10
WINDOW_S = 10.0
MAX_MESSAGE_CHARS = 2000


class RepeatThrottle(logging.Filter):
    def __init__(self, burst: int = BURST, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.burst, self.window_s, self.clock = burst, window_s, clock
        self._windows: dict[tuple[str, int, int], list] = {}  # key -> [window start, passed, suppressed]
        self._lock = threading.Lock()  # a handler's filters run in whichever thread logged

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.pathname, record.lineno, record.levelno)
        now = self.clock()
        with self._lock:
            window = self._windows.get(key)
            if window is None or now - window[0] >= self.window_s:
                suppressed = window[2] if window is not None else 0
                self._windows[key] = [now, 1, 0]
                if suppressed:
                    record.suppressed = suppressed
            elif window[1] < self.burst:
                window[1] += 1
            else:
                window[2] += 1
                return False
        _clip(record)
        return True


def _clip(record: logging.LogRecord) -> None:
    message = record.getMessage()
    if len(message) > MAX_MESSAGE_CHARS:
        record.msg, record.args = f"{message[:MAX_MESSAGE_CHARS]}… ({len(message) - MAX_MESSAGE_CHARS} characters cut)", ()


class SuppressedFormatter(logging.Formatter):
    """A plain line, with the number of lines like it that were held back before it."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        suppressed = getattr(record, "suppressed", 0)
        return f"{line} [{suppressed} more like this were not logged]" if suppressed else line
