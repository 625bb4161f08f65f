"""The JSON lines a job prints on stdout, the only thing it prints there.

    {"event": "progress", "done": <int>, "total": <int|null>}   at most ~5 a second
    {"event": "result", "result": {...}}                        last line, exit 0
    {"event": "error", "reason": "<for people>"}                bad input, exit 2

registry/jobs/child.py reads them. Any other failure is a crash: a traceback on stderr
and exit 1, which the parent reports with the stderr tail. JSON has no NaN or
infinity, so a non-finite float in an event is written as null.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from typing import IO

from serving.config import ConfigError
from serving.jobs.formats import FormatError
from serving.model_safety import UnsafeModel

BAD_INPUT_EXIT = 2
MIN_PROGRESS_INTERVAL_S = 0.2


def finite(value: object) -> object:
    """`value` with every non-finite float replaced by None, for strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def emit(event: dict, stream: IO[str] | None = None) -> None:
    stream = stream or sys.stdout
    stream.write(json.dumps(finite(event), allow_nan=False, separators=(",", ":")) + "\n")
    stream.flush()


class Progress:
    """Emits progress events, no more often than MIN_PROGRESS_INTERVAL_S apart."""

    def __init__(self, total: int | None, clock: Callable[[], float] = time.monotonic):
        self.total = total
        self._clock = clock
        self._last_s: float | None = None

    def tick(self, done: int) -> None:
        now_s = self._clock()
        if self._last_s is None or now_s - self._last_s >= MIN_PROGRESS_INTERVAL_S:
            self._last_s = now_s
            emit({"event": "progress", "done": done, "total": self.total})

    def finish(self, done: int) -> None:
        self.total = done
        emit({"event": "progress", "done": done, "total": done})


def bad_input_reason(error: BaseException) -> str | None:
    """The reason to report for an error that is the input's fault, else None (a crash)."""
    if isinstance(error, FormatError | UnsafeModel):
        return error.reason
    if isinstance(error, ConfigError):
        return f"the serving settings are unusable: {error}"
    return None


def run_job(command: Callable[[], dict]) -> int:
    """Run `command`, print its result or its bad-input error; the exit code."""
    try:
        result = command()
    except Exception as error:
        reason = bad_input_reason(error)
        if reason is None:
            raise
        emit({"event": "error", "reason": reason})
        return BAD_INPUT_EXIT
    emit({"event": "result", "result": result})
    return 0


def peak_rss_bytes() -> int | None:
    """The process's peak resident set (VmHWM), None where /proc is not there."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
