"""`make run`'s stack stops whole: every child it started is gone after it exits, even
when the stop signal comes twice (Ctrl-C pressed again, or make's SIGTERM after ours), or
as a hangup (the terminal closed); a child that dies stops the rest with exit status 1;
a port already taken is refused before anything starts, naming by PID the stack of this
DATA_DIR that still holds it; a worker started by hand beside it follows its console
without being told where, and its push channel across the stack's restarts."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from console import console_address, embedded_redis, processes
from console.embedded_redis import free_port
from console.processes import sweep_groups, wait_http
from tools.stack import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if is_alive(pid)]


def is_alive(pid: int) -> bool:
    # A process can end between any two looks at it; one that has ended is simply not alive.
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start_stack(tmp_path, port: int | None = None, serving_port: int | None = None, *, redis_port_given: bool = True,
                errors_name: str = "stderr.log", redis_url: str | None = None) -> tuple[subprocess.Popen, int, Path]:
    """``redis_url``: a Redis given to it; else the embedded server, as `make run` starts it."""
    port, serving_port = port or free_port(), serving_port or free_port()
    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "DJANGO_SECRET_KEY", "EMBEDDED_REDIS_PORT", "REDIS_URL"}}
    env.update(DATA_DIR=str(tmp_path / "data"))
    if redis_url is not None:
        env.update(REDIS_URL=redis_url)
    elif redis_port_given:
        env.update(EMBEDDED_REDIS_PORT=str(free_port()))
    errors = tmp_path / errors_name
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


def start_worker_by_hand(data_dir: Path, tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    """`manage.py serve` with no CONSOLE_URL or REDIS_URL: it takes what runstack recorded in ``data_dir``."""
    withheld = {"CONSOLE_URL", "DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY"}
    env = {key: value for key, value in os.environ.items() if key not in withheld}
    env.update(DATA_DIR=str(data_dir), SERVING_CACHE_DIR=str(tmp_path / "by-hand"), SERVING_DEVICE="cpu")
    port, log = free_port(), tmp_path / "by-hand.log"
    worker = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=log.open("w"))
    return worker, port, log


def channel_joins(log: Path) -> int:
    return log.read_text().count('"event": "channel_joined"')


def console_port(data_dir: Path) -> int:
    return urlsplit(console_address.recorded(data_dir)).port


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


@contextmanager
def stack_up(tmp_path: Path) -> Iterator[Running]:
    """A stack up and serving; whatever it leaves behind is killed by PID afterwards."""
    stack, serving_port, errors = start_stack(tmp_path)
    children: list[int] = []
    try:
        wait_http(f"http://127.0.0.1:{serving_port}/v2/health/live", stack, timeout_s=120)
        children = [child.pid for child in psutil.Process(stack.pid).children(recursive=True)]
        yield Running(stack, errors, children, tmp_path / "data", serving_port)
    finally:
        stop_leftovers(stack, children)


@pytest.fixture
def running(tmp_path) -> Iterator[Running]:
    """A stack of the test's own, which the test may stop or break."""
    with stack_up(tmp_path) as up:
        yield up


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Iterator[Running]:
    """One stack for the tests that only look at it or work beside it: a start and a stop
    cost about 9 s each time."""
    with stack_up(tmp_path_factory.mktemp("shared-stack")) as up:
        yield up


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
        seen_at = time.monotonic()  # one stamp a pass: two found gone in the same pass are a tie, not an order
        for pid in set(running.children) - set(gone_at) - set(alive(running.children)):
            gone_at[pid] = seen_at
        time.sleep(0.005)
    running.stack.wait(timeout=30)

    assert set(gone_at) == set(running.children)
    assert gone_at[redis] >= max(gone_at[pid] for pid in others)


def test_a_stopped_stack_lists_its_worker_as_stopped_not_gone(running):
    # Stopped together, the console went first and missed the worker's last report: the
    # worker stayed "serving", then "gone", named "not measured" by every drill for an hour.
    running.stack.send_signal(signal.SIGTERM)
    running.stack.wait(timeout=60)

    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL"}}
    env.update(DATA_DIR=str(running.data_dir))
    code = ("from registry.fleet.workers import lifecycle; from registry.models import Worker; "
            "print(sorted(lifecycle(worker) for worker in Worker.objects.all()))")
    listed = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)

    assert listed.stdout.strip().splitlines()[-1] == "['stopped']", listed.stderr[-2000:]


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
    # Whole: cut at four words it was "manage.py serve --host", without the host.
    assert f"the serving worker ({sys.executable} manage.py serve --host 127.0.0.1 --port {running.serving_port}) exited with -9" in said
    assert "the stack was stopped" in said
    assert all_gone(running.children)


def test_a_child_that_dies_before_it_answers_is_named_too(tmp_path):
    """Killed while the stack waits for it to answer (the worker between /live and /ready):
    the refusal named only its argv."""
    stack, serving_port, errors = start_stack(tmp_path)
    started: list[int] = []
    try:
        worker = wait_until(lambda: next((child for child in psutil.Process(stack.pid).children()
                                          if "serve" in child.cmdline()), None), 120, interval_s=0.01)
        assert worker, errors.read_text()
        started = [process.pid for process in psutil.Process(stack.pid).children(recursive=True)]

        worker.kill()
        stack.wait(timeout=60)

        said = errors.read_text()
        assert stack.returncode == 1
        assert f"the serving worker ({sys.executable} manage.py serve --host 127.0.0.1 --port {serving_port}) exited with -9 before answering" in said
        assert all_gone(started), command_lines(started)
    finally:
        stop_leftovers(stack, started)


def test_a_port_already_taken_is_refused_before_anything_starts(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        stack, _, errors = start_stack(tmp_path, port=port)
        stack.wait(timeout=60)

    assert stack.returncode == 1
    assert f"127.0.0.1:{port} is not free" in errors.read_text()
    assert not (tmp_path / "data" / "redis").exists()  # refused before Redis, migrations or anything else


def refused_at_start(tmp_path, redis_url: str) -> tuple[int, list[str]]:
    """runstack --no-demo on ``redis_url``: its exit status and what it printed on stderr.
    Stopped, with whatever it started, if it is still running after 60 s."""
    stack, _, errors = start_stack(tmp_path, redis_url=redis_url)
    try:
        stack.wait(timeout=60)
    finally:
        stop_leftovers(stack, [])  # its own stop stops its children
    return stack.returncode, errors.read_text().splitlines()


def nothing_was_written(data_dir: Path) -> bool:
    """No migration ran (the settings make an empty database file) and no stack was recorded."""
    database = data_dir / "db.sqlite3"
    return (not database.exists() or database.stat().st_size == 0) and not (data_dir / processes.STACK_FILE_NAME).exists() \
        and not (data_dir / console_address.REDIS_FILE_NAME).exists()


def test_a_redis_url_of_another_scheme_stops_the_stack_before_anything_is_written(tmp_path):
    # It migrated, wrote demo version 1, and only then failed, in tracebacks from Celery's
    # sends ("No such transport: http") and from redis-py.
    returncode, said = refused_at_start(tmp_path, f"http://user:hunter2@127.0.0.1:{free_port()}/0")

    assert returncode == 1
    assert len(said) == 1 and said[0].startswith("manage.py: REDIS_URL='http://user:***@127.0.0.1:"), said
    assert said[0].endswith("expected a redis:// or rediss:// URL, e.g. redis://127.0.0.1:6379/0")
    assert nothing_was_written(tmp_path / "data")


def test_a_given_redis_that_does_not_answer_stops_the_stack_naming_it_before_anything_starts(tmp_path):
    # The stack printed "Ready" while Celery and the worker retried it for ever: uploads stayed `validating`.
    port = free_port()  # nothing listens there

    returncode, said = refused_at_start(tmp_path, f"redis://:hunter2@127.0.0.1:{port}/0")

    assert returncode == 1
    assert len(said) == 1, said
    assert said[0].startswith(f"CommandError: REDIS_URL='redis://:***@127.0.0.1:{port}/0': PING failed (ConnectionError: ")
    assert "Connection refused" in said[0] and "hunter2" not in said[0]
    assert nothing_was_written(tmp_path / "data")


def test_a_given_redis_that_refuses_the_password_stops_the_stack_naming_it(tmp_path):
    server, url = embedded_redis.start(tmp_path / "given-redis", port=free_port(), password="the-right-one")
    try:
        returncode, said = refused_at_start(tmp_path, url.replace("the-right-one", "hunter2"))
    finally:
        embedded_redis.stop(server)

    assert returncode == 1
    assert len(said) == 1, said
    assert said[0].startswith("CommandError: REDIS_URL='redis://:***@127.0.0.1:") and "PING failed (AuthenticationError: " in said[0]
    assert nothing_was_written(tmp_path / "data")


def test_a_given_redis_that_answers_runs_the_stack_on_it(tmp_path):
    server, url = embedded_redis.start(tmp_path / "given-redis", port=free_port(), password="the-right-one")
    stack, serving_port, errors = start_stack(tmp_path, redis_url=url)
    children: list[int] = []
    try:
        wait_http(f"http://127.0.0.1:{serving_port}/v2/health/ready", stack, timeout_s=120)
        children = [child.pid for child in psutil.Process(stack.pid).children(recursive=True)]
        console = next(child for child in psutil.Process(stack.pid).children() if "uvicorn" in child.cmdline())

        assert console.environ()["REDIS_URL"] == url  # the environment Celery and the worker get too
        assert not any("redis-server" in " ".join(child.cmdline()) for child in psutil.Process(stack.pid).children())  # no embedded one
    finally:
        stop_leftovers(stack, children)
        embedded_redis.stop(server)
    assert "Traceback" not in errors.read_text()


def test_a_worker_started_by_hand_beside_the_stack_follows_its_console_unasked(shared, tmp_path):
    """No CONSOLE_URL: `manage.py serve` takes the address runstack recorded in DATA_DIR
    (the stack's console is on a free port, not the default one)."""
    worker, port, log = start_worker_by_hand(shared.data_dir, tmp_path)
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", worker, timeout_s=60)  # ready: it applied its console's state
        # ...and joined the stack's push channel: without it each change waited for the next poll.
        assert wait_until(lambda: channel_joins(log), 30), log.read_text()
        assert oct((shared.data_dir / "redis-url").stat().st_mode & 0o777) == "0o600"  # it carries the Redis password
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


def test_the_same_port_twice_from_the_environment_is_refused_naming_the_variables():
    # Set as the README says (CONSOLE_PORT=9000 SERVING_PORT=9001 make run), a slip that gave
    # both the same port was refused naming only --port and --serving-port, flags never typed.
    environment = {**os.environ, "CONSOLE_PORT": "18997", "SERVING_PORT": "18997"}
    finished = subprocess.run([sys.executable, "manage.py", "runstack", "--no-demo"], cwd=ROOT, env=environment, capture_output=True, timeout=60,
                              check=False)

    said = finished.stderr.decode()
    assert finished.returncode != 0
    assert "are both 18997" in said
    assert "CONSOLE_PORT" in said and "SERVING_PORT" in said, said


def test_the_consoles_try_it_form_reaches_the_worker_on_the_serving_port_given(shared):
    console = next(child for child in psutil.Process(shared.stack.pid).children() if "uvicorn" in child.cmdline())

    assert console.environ()["SERVING_PUBLIC_URL"] == f"http://127.0.0.1:{shared.serving_port}"


def test_an_empty_serving_public_url_or_secure_cookies_is_unset_for_the_stack_as_for_every_setting(tmp_path, monkeypatch):
    # As a .env file or compose writes a variable left unset. Taken as set, the try-it form
    # reached :8001 whatever --serving-port said, and plain http got Secure cookies.
    monkeypatch.setenv("SERVING_PUBLIC_URL", "")
    monkeypatch.setenv("SECURE_COOKIES", "")
    with stack_up(tmp_path) as up:
        console = next(child for child in psutil.Process(up.stack.pid).children() if "uvicorn" in child.cmdline())
        environment = console.environ()

    assert (environment["SERVING_PUBLIC_URL"], environment["SECURE_COOKIES"]) == (f"http://127.0.0.1:{up.serving_port}", "false")


def test_a_command_run_by_hand_beside_the_stack_sends_to_its_worker_not_the_default_port(shared):
    # manage.py demo_traffic took SERVING_PUBLIC_URL's default, :8001, whatever --serving-port said.
    env = {key: value for key, value in os.environ.items() if key not in {"SERVING_PUBLIC_URL", "DATABASE_URL", "REDIS_URL"}}
    script = "import django; django.setup(); from django.conf import settings; print(settings.SERVING_PUBLIC_URL)"
    shown = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**env, "DATA_DIR": str(shared.data_dir),
                           "DJANGO_SETTINGS_MODULE": "console.settings"}, capture_output=True, text=True, timeout=60, check=True)

    assert shown.stdout.strip().splitlines()[-1] == f"http://127.0.0.1:{shared.serving_port}"


def test_the_console_refuses_a_request_head_past_64_kib_without_holding_it(shared):
    """uvicorn's default parser took a 50 MiB header line from anyone, and kept the memory."""
    from urllib.parse import urlsplit

    from console.console_address import recorded

    console = urlsplit(recorded(shared.data_dir))
    with socket.create_connection((console.hostname, console.port), timeout=30) as connection:
        try:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * (4 << 20) + b"\r\n\r\n")
        except ConnectionResetError:
            pass  # refused before the last of it was sent
        answer = connection.recv(200)

    assert answer.startswith(b"HTTP/1.1 400 ")


def test_the_console_refuses_a_body_framed_both_by_length_and_as_chunked(shared):
    """h11 reads such a body as chunked, while the upload limit read the declared length."""
    from urllib.parse import urlsplit

    from console.console_address import recorded

    console = urlsplit(recorded(shared.data_dir))
    with socket.create_connection((console.hostname, console.port), timeout=30) as connection:
        connection.sendall(b"POST /api/models/digits/versions/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\n4000\r\n" + b"x" * 0x4000 + b"\r\n")
        answer = b""
        while chunk := connection.recv(4096):  # the refusal closes the connection
            answer += chunk

    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"both Content-Length and Transfer-Encoding" in answer


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


def test_a_worker_started_by_hand_rejoins_the_push_channel_after_the_stack_restarts(tmp_path):
    """It read the recorded Redis URL once, at its start: the next stack's embedded Redis
    (no EMBEDDED_REDIS_PORT, as `make run` starts it) is where that URL says, with the same
    password. On another port it retried the old one for ever and followed by polling."""
    port, serving_port = free_port(), free_port()
    data_dir = tmp_path / "data"
    first, _, _ = start_stack(tmp_path, port, serving_port, redis_port_given=False)
    first_children: list[int] = []
    second, second_children = None, []
    worker, worker_port, log = None, 0, tmp_path / "by-hand.log"
    try:
        wait_http(f"http://127.0.0.1:{serving_port}/v2/health/live", first, timeout_s=120)
        first_children = [child.pid for child in psutil.Process(first.pid).children(recursive=True)]
        redis_url = console_address.recorded(data_dir, console_address.REDIS_FILE_NAME)
        worker, worker_port, log = start_worker_by_hand(data_dir, tmp_path)
        assert wait_until(lambda: channel_joins(log), 60), log.read_text()
        first.send_signal(signal.SIGINT)  # Ctrl-C on `make run`
        first.wait(timeout=60)

        second, _, _ = start_stack(tmp_path, port, serving_port, redis_port_given=False, errors_name="second.log")
        wait_http(f"http://127.0.0.1:{serving_port}/v2/health/live", second, timeout_s=120)
        second_children = [child.pid for child in psutil.Process(second.pid).children(recursive=True)]

        assert wait_until(lambda: channel_joins(log) >= 2, 60), log.read_text()[-2000:]  # its reconnects back off to 10 s
        assert console_address.recorded(data_dir, console_address.REDIS_FILE_NAME) == redis_url  # same port, same password
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)
        if second is not None:
            stop_leftovers(second, second_children)
        stop_leftovers(first, first_children)


def test_the_next_stack_names_by_pid_what_a_stack_killed_with_sigkill_left_running(running, tmp_path):
    """SIGKILL gives runstack no chance to stop its children: they run on under PID 1,
    holding the ports. The refusal names them, to be stopped by hand; it stops nothing."""
    left = psutil.Process(running.stack.pid).children()  # each in a session of its own: killpg reaches theirs
    try:
        running.stack.kill()
        running.stack.wait(timeout=10)

        again, _, errors = start_stack(tmp_path, console_port(running.data_dir), running.serving_port, errors_name="again.log")
        again.wait(timeout=60)

        said = errors.read_text()
        assert again.returncode == 1
        assert "is not free" in said and "still runs without its runstack" in said and "Traceback" not in said
        to_stop = re.search(r"stop them with `kill ([0-9 ]+)`", said)
        assert to_stop and sorted(map(int, to_stop.group(1).split())) == sorted(child.pid for child in left), said
        assert alive([child.pid for child in left]) == [child.pid for child in left]  # named, not stopped
    finally:
        sweep_groups(left)  # by process group: what the orphaned children started after the snapshot too


def test_a_stack_still_running_is_named_by_its_runstack_pid_in_the_next_ones_refusal(shared):
    # The same DATA_DIR (the shared stack's): its record names the stack still running.
    again, _, errors = start_stack(shared.data_dir.parent, console_port(shared.data_dir), shared.serving_port, errors_name="again.log")
    again.wait(timeout=60)

    said = errors.read_text()
    assert again.returncode == 1
    assert f"(runstack PID {shared.stack.pid}; embedded Redis PID " in said
    assert f"still runs: stop it with `kill {shared.stack.pid}`" in said
    assert shared.stack.poll() is None  # named, not stopped


def test_a_stack_recorded_whose_pids_now_belong_to_later_processes_is_not_named(tmp_path):
    """A PID the kernel handed to another process since: its start time is not the one recorded."""
    later = subprocess.Popen(["sleep", "60"])
    try:
        record = ("import sys; from pathlib import Path; from console.processes import record_stack; "
                  "record_stack(Path(sys.argv[1]), {int(sys.argv[2]): 'console'})")
        subprocess.run([sys.executable, "-c", record, str(tmp_path), str(later.pid)], cwd=ROOT, check=True, timeout=60)
        assert f"console PID {later.pid}; stop them with `kill {later.pid}`" in processes.stack_still_running(tmp_path)  # the record holds
        recorded = json.loads((tmp_path / processes.STACK_FILE_NAME).read_text())
        recorded["children"][0]["started"] -= 3600  # the console it named started an hour before this PID's process

        (tmp_path / processes.STACK_FILE_NAME).write_text(json.dumps(recorded))

        assert processes.stack_still_running(tmp_path) == ""
    finally:
        later.kill()
        later.wait(timeout=10)


def test_a_recorded_redis_port_now_taken_is_not_reused(tmp_path):
    password = embedded_redis.generated_password(tmp_path / embedded_redis.PASSWORD_FILE)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]

        assert embedded_redis.reusable_port(f"redis://:{password}@127.0.0.1:{port}/0", password) is None
    assert embedded_redis.reusable_port(f"redis://:{password}@127.0.0.1:{port}/0", password) == port  # once free


@pytest.mark.parametrize("recorded", ["redis://:another@127.0.0.1:{port}/0", "redis://:{password}@10.0.0.7:{port}/0",
                                      "redis://:{password}@127.0.0.1:99999/0", "", "not a url"],
                         ids=["a REDIS_URL given last time", "not loopback", "port out of range", "none recorded", "garbage"])
def test_a_recorded_redis_url_not_of_an_embedded_server_gives_no_port_to_reuse(tmp_path, recorded):
    password = embedded_redis.generated_password(tmp_path / embedded_redis.PASSWORD_FILE)

    assert embedded_redis.reusable_port(recorded.format(port=free_port(), password=password), password) is None


def signed_in_session(data_dir: Path) -> tuple[str, str]:
    """(the session cookie's name, a session of a new user) in the stack's own database."""
    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY"}}
    script = ("import django; django.setup(); from django.conf import settings; from django.contrib.auth.models import User; "
              "from django.test import Client; client = Client(); "
              "client.force_login(User.objects.create_user('feed-viewer', password='not-used-here-7Q')); "
              "print(settings.SESSION_COOKIE_NAME, client.cookies[settings.SESSION_COOKIE_NAME].value)")
    shown = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**env, "DATA_DIR": str(data_dir),
                           "DJANGO_SETTINGS_MODULE": "console.settings"}, capture_output=True, text=True, timeout=60, check=True)
    name, value = shown.stdout.strip().splitlines()[-1].split()
    return name, value


def test_the_live_feed_drops_a_clients_frame_unread_and_closes_one_past_4_kib_with_1009(shared):
    """The feed decoded each client frame's JSON on the event loop, and uvicorn took frames
    up to 16 MiB: two signed-in sockets sending 16 MiB arrays held light requests for seconds."""
    import struct

    from websockets.exceptions import ConnectionClosedError
    from websockets.sync.client import connect

    console_url = console_address.recorded(shared.data_dir)
    cookie_name, session = signed_in_session(shared.data_dir)
    opened = {"origin": console_url, "additional_headers": {"Cookie": f"{cookie_name}={session}"}, "compression": None,
              "proxy": None, "ping_interval": None, "open_timeout": 30}
    socket_url = console_url.replace("http://", "ws://") + "/ws/live/"

    with connect(socket_url, **opened) as feed:
        feed.send("{" * 3000)  # under the cap, and no JSON: dropped, never decoded
        assert feed.ping().wait(timeout=10)  # the feed is still open
    with connect(socket_url, **opened) as feed:
        # A text frame's head declaring 1 MiB: refused from the head, before its payload is buffered.
        feed.socket.sendall(bytes([0x81, 0x80 | 127]) + struct.pack("!Q", 1 << 20) + os.urandom(4))
        deadline = time.monotonic() + 10
        with pytest.raises(ConnectionClosedError) as closed:
            while True:  # the stack's worker reports reach the feed meanwhile
                feed.recv(timeout=max(deadline - time.monotonic(), 0.01))

    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    assert "Traceback" not in shared.errors.read_text()
