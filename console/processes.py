"""Child processes of a stack (console, worker, Celery): wait for one to answer, and
stop them all, newest first. Shared by ``runstack`` and the browser tests."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable

READY_TIMEOUT_S = 60.0
# The console's uvicorn parses HTTP with h11, whose buffer for an incomplete request head
# is bounded: httptools, uvicorn's default, accepted a 50 MiB header line from anyone and
# grew the console by 100 MiB a request. 64 KiB holds any real browser's or client's
# headers. And no X-Forwarded-For or -Proto is believed: uvicorn's default takes them from
# 127.0.0.1, so through make run, an SSH tunnel or a port-forward any client could name
# its own address and step around the sign-in lockout (django-axes counts by address).
# The Dockerfile, compose and Kubernetes command lines say the same (tests/deploy).
CONSOLE_HTTP_OPTIONS = ("--http", "h11", "--h11-max-incomplete-event-size", "65536", "--no-proxy-headers")
STOP_GRACE_S = 10.0
# A serving worker loads models: it never gets the database's credentials or the
# console's signing key (see worker_environment).
WORKER_WITHHELD_VARIABLES = ("DATABASE_URL", "DATABASE_URL_FILE", "DJANGO_SECRET_KEY", "DJANGO_SECRET_KEY_FILE")


def worker_environment(environment: dict[str, str]) -> dict[str, str]:
    """``environment`` for a ``manage.py serve`` child: no database URL, and a throwaway
    Django key, so that importing settings does not read the real one from DATA_DIR."""
    worker = {name: value for name, value in environment.items() if name not in WORKER_WITHHELD_VARIABLES}
    worker["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(64)
    return worker


def wait_http(url: str, process: subprocess.Popen, timeout_s: float = READY_TIMEOUT_S,
              between_tries: Callable[[], None] | None = None) -> None:
    """Until ``url`` answers 200; fail at once if the process exits first. ``between_tries``
    runs before each try (runstack's: raises once a stop was asked)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if between_tries is not None:
            between_tries()
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[:4]} exited with {process.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")


def stop_all(processes: list[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to each, newest first, then wait for each (together, up to ``grace_s``) and
    kill stragglers. runstack calls it twice, so that its Redis stops after the rest."""
    for process in reversed(processes):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in reversed(processes):
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def sweep_groups(processes: list[subprocess.Popen]) -> None:
    """SIGKILL whatever is left in the process groups of ``processes``, each started in a
    session of its own (so its PID is its group's ID) and already stopped: a child's own
    children that outlived it (two Celery beat processes were found orphaned after stacks
    stopped just after their start; the cause was not reproduced). A group ID is not
    handed to a new process while any member lives, so this reaches only what they left."""
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # nothing left in it
            pass
