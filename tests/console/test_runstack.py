"""`make run`'s stack stops whole: every child it started is gone after it exits, even
when the stop signal comes twice (Ctrl-C pressed again, or make's SIGTERM after ours), or
as a hangup (the terminal closed); a child that dies stops the rest with exit status 1;
a port already taken is refused before anything starts; a worker started by hand beside
it follows its console without being told where."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from console.embedded_redis import free_port
from console.processes import sweep_groups, wait_http
from tools.stack import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def start_stack(tmp_path, port: int | None = None, serving_port: int | None = None) -> tuple[subprocess.Popen, int, Path]:
    port, serving_port = port or free_port(), serving_port or free_port()
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
    if stack.poll() is None:  # its own stop first: it knows children started after the snapshot (Celery's beat)
        stack.terminate()
        try:
            stack.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stack.kill()
            stack.wait(timeout=10)
    for pid in alive(children):  # by PID: what this test's stack started and left
        os.kill(pid, signal.SIGKILL)


def all_gone(children: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(children) == []


def command_lines(pids: list[int]) -> list[str]:
    """What each of ``pids`` still alive runs: for a failure's message."""
    lines = []
    for pid in alive(pids):
        try:
            lines.append(" ".join(psutil.Process(pid).cmdline())[:120])
        except psutil.Error:
            pass
    return lines


@dataclass
class Running:
    stack: subprocess.Popen
    errors: Path
    children: list[int]  # every process it started, by PID
    data_dir: Path
    serving_port: int


@pytest.fixture
def running(tmp_path) -> Iterator[Running]:
    """A stack up and serving; whatever it leaves behind is killed by PID afterwards."""
    stack, serving_port, errors = start_stack(tmp_path)
    children: list[int] = []
    try:
        wait_http(f"http://127.0.0.1:{serving_port}/v2/health/live", stack, timeout_s=120)
        children = [child.pid for child in psutil.Process(stack.pid).children(recursive=True)]
        yield Running(stack, errors, children, tmp_path / "data", serving_port)
    finally:
        stop_leftovers(stack, children)


def test_a_second_stop_signal_does_not_cut_the_stop_short(running):
    stack = running.stack
    assert len(running.children) >= 4  # Redis, console, worker, Celery

    deadline = time.monotonic() + 60
    while stack.poll() is None and time.monotonic() < deadline:  # through the stop and the exit after it
        stack.send_signal(signal.SIGTERM)
        time.sleep(0.005)
    stack.wait(timeout=10)

    assert "Traceback" not in running.errors.read_text()  # the stop ran to its end
    assert stack.returncode == 0
    assert all_gone(running.children)


def test_the_embedded_redis_stops_after_everything_that_uses_it(running):
    # Stopped together, Redis went first and a Celery worker still shutting down lost its
    # broker: "Couldn't ack" and tracebacks on the terminal.
    direct = psutil.Process(running.stack.pid).children()  # what the stack stops itself, in order
    redis = next(child.pid for child in direct if "redis-server" in " ".join(child.cmdline()))
    others = [child.pid for child in direct if child.pid != redis]
    gone_at: dict[int, float] = {}

    running.stack.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while len(gone_at) < len(running.children) and time.monotonic() < deadline:
        for pid in set(running.children) - set(gone_at) - set(alive(running.children)):
            gone_at[pid] = time.monotonic()
        time.sleep(0.005)
    running.stack.wait(timeout=30)

    assert set(gone_at) == set(running.children)
    assert gone_at[redis] >= max(gone_at[pid] for pid in others)


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
    assert "the serving worker (" in said and "manage.py serve" in said
    assert "exited with -9" in said and "the stack was stopped" in said
    assert all_gone(running.children)


def test_a_port_already_taken_is_refused_before_anything_starts(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        stack, _, errors = start_stack(tmp_path, port=port)
        stack.wait(timeout=60)

    assert stack.returncode == 1
    assert f"127.0.0.1:{port} is not free" in errors.read_text()
    assert not (tmp_path / "data" / "redis").exists()  # refused before Redis, migrations or anything else


def test_a_worker_started_by_hand_beside_the_stack_follows_its_console_unasked(running, tmp_path):
    """No CONSOLE_URL: `manage.py serve` takes the address runstack recorded in DATA_DIR
    (the stack's console is on a free port, not the default one)."""
    withheld = {"CONSOLE_URL", "DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY"}
    env = {key: value for key, value in os.environ.items() if key not in withheld}
    env.update(DATA_DIR=str(running.data_dir), SERVING_CACHE_DIR=str(tmp_path / "by-hand"), SERVING_DEVICE="cpu")
    port = free_port()
    worker = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=(tmp_path / "by-hand.log").open("w"))
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", worker, timeout_s=60)  # ready: it applied its console's state
        # ...and joined the stack's push channel: without it each change waited for the next poll.
        assert wait_until(lambda: '"event": "channel_joined"' in (tmp_path / "by-hand.log").read_text(), 30), \
            (tmp_path / "by-hand.log").read_text()
        assert oct((running.data_dir / "redis-url").stat().st_mode & 0o777) == "0o600"  # it carries the Redis password
    finally:
        worker.terminate()
        worker.wait(timeout=30)


@pytest.mark.parametrize("child", ["redis-server", "uvicorn", "manage.py serve"])
def test_two_stop_signals_back_to_back_during_the_start_still_stop_everything(tmp_path, child):
    """`timeout` signals the stack and then its group; Ctrl-C pressed twice does the same.
    Sent the moment ``child`` appears: while the stack is still waiting for it to answer."""
    stack, _, errors = start_stack(tmp_path)
    started: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and stack.poll() is None:
            children = psutil.Process(stack.pid).children(recursive=True)
            if any(child in " ".join(process.cmdline()) for process in children if process.is_running()):
                started = [process.pid for process in children]
                break
            time.sleep(0.01)
        assert started, f"the stack never started {child}"
        stack.send_signal(signal.SIGINT)
        stack.send_signal(signal.SIGTERM)
        stack.wait(timeout=60)
        assert stack.returncode == 0, errors.read_text()
        assert "Traceback" not in errors.read_text()
        assert all_gone(started), command_lines(started)
    finally:
        stop_leftovers(stack, started)


@pytest.mark.parametrize("ports", [["--port", "99999"], ["--port", "-1"], ["--port", "0"], ["--port", "19999", "--serving-port", "19999"]],
                         ids=["past 65535", "negative", "zero", "the same twice"])
def test_a_port_out_of_range_or_given_twice_is_refused_naming_it(ports):
    finished = subprocess.run([sys.executable, "manage.py", "runstack", "--no-demo", *ports], cwd=ROOT, capture_output=True, timeout=60, check=False)

    said = finished.stderr.decode()
    assert finished.returncode != 0
    assert "Traceback" not in said
    assert "expected a port number from 1 to 65535" in said or "are both 19999" in said


def test_the_consoles_try_it_form_reaches_the_worker_on_the_serving_port_given(running):
    console = next(child for child in psutil.Process(running.stack.pid).children() if "uvicorn" in child.cmdline())

    assert console.environ()["SERVING_PUBLIC_URL"] == f"http://127.0.0.1:{running.serving_port}"


def test_a_command_run_by_hand_beside_the_stack_sends_to_its_worker_not_the_default_port(running):
    # manage.py demo_traffic took SERVING_PUBLIC_URL's default, :8001, whatever --serving-port said.
    env = {key: value for key, value in os.environ.items() if key not in {"SERVING_PUBLIC_URL", "DATABASE_URL", "REDIS_URL"}}
    script = "import django; django.setup(); from django.conf import settings; print(settings.SERVING_PUBLIC_URL)"
    shown = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**env, "DATA_DIR": str(running.data_dir),
                           "DJANGO_SETTINGS_MODULE": "console.settings"}, capture_output=True, text=True, timeout=60, check=True)

    assert shown.stdout.strip().splitlines()[-1] == f"http://127.0.0.1:{running.serving_port}"


def test_the_console_refuses_a_request_head_past_64_kib_without_holding_it(running):
    """uvicorn's default parser took a 50 MiB header line from anyone, and kept the memory."""
    from urllib.parse import urlsplit

    from console.console_address import recorded

    console = urlsplit(recorded(running.data_dir))
    with socket.create_connection((console.hostname, console.port), timeout=30) as connection:
        try:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * (4 << 20) + b"\r\n\r\n")
        except ConnectionResetError:
            pass  # refused before the last of it was sent
        answer = connection.recv(200)

    assert answer.startswith(b"HTTP/1.1 400 ")


def test_what_a_stopped_child_left_in_its_process_group_is_swept():
    child = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!"], stdout=subprocess.PIPE, start_new_session=True)
    grandchild = int(child.stdout.readline())
    child.wait(timeout=10)
    try:
        assert alive([grandchild])  # the child is gone; what it started is not

        sweep_groups([child])

        assert all_gone([grandchild])
    finally:
        stop_leftovers(child, [grandchild])
