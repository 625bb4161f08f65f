"""`make run`'s stack stops whole: every child it started is gone after it exits, even
when the stop signal comes twice (Ctrl-C pressed again, or make's SIGTERM after ours), or
as a hangup (the terminal closed); a child that dies stops the rest with exit status 1;
a port already taken is refused before anything starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from console.embedded_redis import free_port
from console.processes import wait_http

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def start_stack(tmp_path, port: int | None = None) -> tuple[subprocess.Popen, int, Path]:
    port, serving_port = port or free_port(), free_port()
    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "DJANGO_SECRET_KEY"}}
    env.update(DATA_DIR=str(tmp_path / "data"), EMBEDDED_REDIS_PORT=str(free_port()))
    env.pop("REDIS_URL", None)  # the embedded server too, as `make run` starts it
    errors = tmp_path / "stderr.log"
    stack = subprocess.Popen(
        [sys.executable, "manage.py", "runstack", "--no-demo", "--port", str(port), "--serving-port", str(serving_port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=errors.open("w"),
    )
    return stack, serving_port, errors


def stop_leftovers(stack: subprocess.Popen, children: list[int]) -> None:
    if stack.poll() is None:
        stack.kill()
        stack.wait(timeout=10)
    for pid in alive(children):  # by PID: what this test's stack started and left
        os.kill(pid, signal.SIGKILL)


def all_gone(children: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(children) == []


@dataclass
class Running:
    stack: subprocess.Popen
    errors: Path
    children: list[int]  # every process it started, by PID


@pytest.fixture
def running(tmp_path) -> Iterator[Running]:
    """A stack up and serving; whatever it leaves behind is killed by PID afterwards."""
    stack, serving_port, errors = start_stack(tmp_path)
    children: list[int] = []
    try:
        wait_http(f"http://127.0.0.1:{serving_port}/v2/health/live", stack, timeout_s=120)
        children = [child.pid for child in psutil.Process(stack.pid).children(recursive=True)]
        yield Running(stack, errors, children)
    finally:
        stop_leftovers(stack, children)


def test_a_second_stop_signal_does_not_cut_the_stop_short(running):
    stack = running.stack
    assert len(running.children) >= 4  # Redis, console, worker, Celery

    for _ in range(20):  # the later ones arrive while the first stop is under way
        if stack.poll() is not None:
            break
        stack.send_signal(signal.SIGTERM)
        time.sleep(0.02)
    stack.wait(timeout=60)

    assert "Traceback" not in running.errors.read_text()  # the stop ran to its end
    assert stack.returncode == 0
    assert all_gone(running.children)


def test_a_hangup_stops_the_whole_stack(running):
    running.stack.send_signal(signal.SIGHUP)  # what closing the terminal sends
    running.stack.wait(timeout=60)

    assert running.stack.returncode == 0, running.errors.read_text()
    assert all_gone(running.children)  # nothing left serving, or answering the next stack's readiness checks


def test_a_child_that_dies_stops_the_stack_with_status_1_naming_it(running):
    worker = next(child for child in psutil.Process(running.stack.pid).children() if "serve" in child.cmdline())

    os.kill(worker.pid, signal.SIGKILL)
    running.stack.wait(timeout=60)

    assert running.stack.returncode == 1
    said = running.errors.read_text()
    assert "'serve'" in said or "manage.py serve" in said
    assert "exited with -9" in said and "the stack was stopped" in said
    assert all_gone(running.children)


def test_a_port_already_taken_is_refused_before_anything_starts(tmp_path):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        stack, _, errors = start_stack(tmp_path, port=port)
        stack.wait(timeout=60)

    assert stack.returncode == 1
    assert f"127.0.0.1:{port} is not free" in errors.read_text()
    assert not (tmp_path / "data" / "redis").exists()  # refused before Redis, migrations or anything else
