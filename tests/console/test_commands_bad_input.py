"""Every management command, given hostile or mistaken input, answers with one clear line
naming the problem (a CommandError: exit status 1 or 2), never a Python traceback, and
leaves nothing half-done. Commands that start servers run as subprocesses, bounded in time."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import QuerySet

from console.embedded_redis import free_port
from registry.models import ModelVersion, RegisteredModel
from serving.contract import CONTRACT_VERSION

ROOT = Path(__file__).resolve().parents[2]
WITHHELD = {"DATABASE_URL", "REDIS_URL", "CI", "CONSOLE_URL", "DJANGO_SECRET_KEY", "SERVING_PUBLIC_URL"}


def environment(tmp_path: Path, **extra: str) -> dict:
    env = {name: value for name, value in os.environ.items() if name not in WITHHELD}
    env.update(DATA_DIR=str(tmp_path / "data"), SERVING_DEVICE="cpu", SERVING_CACHE_DIR=str(tmp_path / "cache"), **extra)
    return env


def manage(tmp_path: Path, *args: str, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=environment(tmp_path, **extra),
                          capture_output=True, text=True, timeout=timeout, check=False)


def refused(finished: subprocess.CompletedProcess, message: str) -> None:
    """Exit 1 or 2 with one line on stderr that names the problem, and no traceback."""
    assert finished.returncode in (1, 2), finished.stderr
    assert "Traceback" not in finished.stderr, finished.stderr
    assert message in finished.stderr, finished.stderr
    assert len(finished.stderr.strip().splitlines()) == 1, finished.stderr


# ---------------------------------------------------------------- any command using the database


@pytest.mark.parametrize("command", [["ensure_login"], ["apply_retention"], ["forget_worker", "w1"], ["make_demo_models"]])
def test_a_database_never_migrated_is_named_with_what_to_run(tmp_path, command):
    """A DATA_DIR mistyped is a new, empty SQLite database: say so, not 'no such table'."""
    finished = manage(tmp_path, *command)

    refused(finished, "run `manage.py migrate`")
    assert str(tmp_path / "data" / "db.sqlite3") in finished.stderr


def test_a_database_that_cannot_be_reached_is_named_without_a_traceback(tmp_path):
    finished = manage(tmp_path, "forget_worker", "w1", DATABASE_URL=f"postgres://nobody@127.0.0.1:{free_port()}/none",
                      DATABASE_CONNECT_TIMEOUT_S="2")

    refused(finished, "cannot reach the database")


# ---------------------------------------------------------------- migrate


def test_migrate_onto_a_database_holding_names_that_differ_only_by_case_names_each_pair_and_applies_once_renamed(tmp_path):
    """Registry migration 0015 makes model names unique ignoring case: a database made
    before it may hold "MyModel" and "mymodel", which the constraint alone would refuse
    with a bare IntegrityError."""
    assert manage(tmp_path, "migrate", "registry", "0014", timeout=120).returncode == 0
    database = sqlite3.connect(tmp_path / "data" / "db.sqlite3")
    with database:
        for name in ("MyModel", "mymodel", "other"):
            database.execute("INSERT INTO registry_registeredmodel (name, description, tags, analysis, created_at)"
                             " VALUES (?, '', '[]', '{}', datetime('now'))", (name,))

    refused(manage(tmp_path, "migrate", timeout=120),
            "model names must now differ by more than case; rename one of each pair in the database "
            "(registry_registeredmodel.name; workers serve it under its new name) and migrate again: 'MyModel' and 'mymodel'")
    with database:
        database.execute("UPDATE registry_registeredmodel SET name = 'mymodel-2' WHERE name = 'mymodel'")
    database.close()

    assert manage(tmp_path, "migrate", timeout=120).returncode == 0
    with pytest.raises(sqlite3.IntegrityError):
        with sqlite3.connect(tmp_path / "data" / "db.sqlite3") as database:
            database.execute("UPDATE registry_registeredmodel SET name = 'MYMODEL' WHERE name = 'other'")


# ---------------------------------------------------------------- celery


@pytest.mark.parametrize("program", [["worker", "--pool", "solo"], ["beat"]])
def test_a_celery_process_started_without_redis_url_refuses_to_run_on_a_broker_no_one_else_reaches(tmp_path, program):
    # It ran on memory:// and silently received nothing (an operator's fault run).
    finished = subprocess.run([sys.executable, "-m", "celery", "--workdir", str(ROOT), "-A", "console", *program, "--loglevel", "warning",
                               *(["--schedule", str(tmp_path / "beat-schedule")] if program == ["beat"] else [])],
                              cwd=tmp_path, env={**environment(tmp_path), "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                              timeout=60, check=False)

    assert finished.returncode == 1, finished.stderr
    assert "Traceback" not in finished.stderr, finished.stderr
    # Beat's redirected stderr prefixes its log format.
    assert "celery: REDIS_URL is not set, so Celery's broker would be memory://" in finished.stderr.strip().splitlines()[-1]


# ---------------------------------------------------------------- ensure_login


@pytest.mark.django_db
@pytest.mark.parametrize(("username", "problem"), [("", "cannot be blank"), ("bad name!", "Enter a valid username"),
                                                    ("x" * 151, "at most 150 characters")], ids=["empty", "spaces", "too long"])
def test_ensure_login_refuses_a_username_the_console_would_refuse(username, problem):
    with pytest.raises(CommandError, match=problem):
        call_command("ensure_login", "--username", username, stdout=io.StringIO())

    assert not User.objects.exists()


@pytest.mark.django_db
def test_ensure_login_run_twice_at_once_says_the_login_exists_instead_of_failing(monkeypatch):
    """The second run checked before the first one's insert, and lost the race to it."""
    User.objects.create_superuser("admin", "", "first-run-password")
    monkeypatch.setattr(QuerySet, "exists", lambda self: False)  # what the losing run saw
    out = io.StringIO()

    call_command("ensure_login", stdout=out)

    assert "Sign in as 'admin'" in out.getvalue()
    assert User.objects.get(username="admin").check_password("first-run-password")


# ---------------------------------------------------------------- apply_retention


@pytest.mark.django_db
@pytest.mark.parametrize("keep", ["0", "-5", "99999999999999999999999"], ids=["zero", "negative", "huge"])
def test_apply_retention_refuses_a_keep_out_of_range(keep):
    RegisteredModel.objects.create(name="digits")  # a model to apply it to: the huge value reached the query

    with pytest.raises(CommandError, match="--keep must be from 1 to") as refusal:
        call_command("apply_retention", "--keep", keep, stdout=io.StringIO())

    assert refusal.value.returncode == 2


# ---------------------------------------------------------------- demo_traffic


@pytest.mark.parametrize("url", ["not-a-url", "ftp://worker/", "http://", "http://worker:notaport"])
def test_demo_traffic_refuses_a_url_that_is_not_http_naming_it(url):
    with pytest.raises(CommandError, match="--url='.*': expected an http:// or https:// URL"):
        call_command("demo_traffic", url=url, seconds=0.1, stdout=io.StringIO())


def test_demo_traffic_names_serving_public_url_when_the_default_is_unusable(settings):
    settings.SERVING_PUBLIC_URL = "worker:8001"

    with pytest.raises(CommandError, match=r"SERVING_PUBLIC_URL='worker:8001': expected an http.*e\.g\. http://127\.0\.0\.1:8001$"):
        call_command("demo_traffic", seconds=0.1, stdout=io.StringIO())


@pytest.mark.parametrize("seconds", ["-1", "nan", "inf"])
def test_demo_traffic_refuses_seconds_that_are_negative_or_not_finite(tmp_path, seconds):
    """A subprocess, bounded: given nan or inf it used to send until stopped."""
    finished = manage(tmp_path, "demo_traffic", "--url", f"http://127.0.0.1:{free_port()}", "--seconds", seconds, timeout=30)

    refused(finished, "--seconds must be")


@pytest.mark.parametrize("key", ["clé", "mk_abc\ndef", "mk abc"], ids=["not ascii", "newline", "space"])
def test_demo_traffic_refuses_an_api_key_that_cannot_be_a_header_without_echoing_it(key):
    with pytest.raises(CommandError, match="--api-key") as refusal:
        call_command("demo_traffic", url=f"http://127.0.0.1:{free_port()}", seconds=0.1, api_key=key, stdout=io.StringIO())

    assert key not in str(refusal.value)


def test_demo_traffic_that_no_worker_answers_exits_1_saying_so(tmp_path):
    """Against nothing listening it printed "ConnectError: 100" and exited 0."""
    port = free_port()

    finished = manage(tmp_path, "demo_traffic", "--url", f"http://127.0.0.1:{port}", "--seconds", "0.3", "--rate", "20", timeout=30)

    assert "ConnectError: " in finished.stdout
    refused(finished, f"requests to http://127.0.0.1:{port}/predict was answered 200")


# ---------------------------------------------------------------- make_demo_models


@pytest.mark.django_db
@pytest.mark.parametrize("versions", ["0", "-1"])
def test_make_demo_models_refuses_fewer_than_one_version(versions):
    with pytest.raises(CommandError, match="--versions must be at least 1"):
        call_command("make_demo_models", "--versions", versions, stdout=io.StringIO())

    assert not RegisteredModel.objects.exists()


@pytest.mark.django_db
def test_make_demo_models_beside_a_model_named_like_the_demo_but_for_case_names_it(tmp_path):
    RegisteredModel.objects.create(name="Digits")

    with pytest.raises(CommandError) as refusal:
        call_command("make_demo_models", stdout=io.StringIO())

    assert str(refusal.value) == ("the demo model 'digits' cannot be registered: a model named 'Digits' exists and model names must "
                                  "differ by more than case; rename that model, or start the stack with `manage.py runstack --no-demo`")
    assert list(RegisteredModel.objects.values_list("name", flat=True)) == ["Digits"]


@pytest.mark.django_db
def test_make_demo_models_refuses_an_export_dir_that_is_a_file_before_registering(tmp_path):
    (tmp_path / "a-file").write_text("")

    with pytest.raises(CommandError, match="--export-dir .*a-file.* is not a directory"):
        call_command("make_demo_models", "--export-dir", str(tmp_path / "a-file"), stdout=io.StringIO())

    assert not RegisteredModel.objects.exists()


@pytest.mark.django_db
def test_make_demo_models_refuses_an_export_dir_it_cannot_create(tmp_path):
    (tmp_path / "a-file").write_text("")

    with pytest.raises(CommandError, match="--export-dir .*cannot create it"):
        call_command("make_demo_models", "--export-dir", str(tmp_path / "a-file" / "sub"), stdout=io.StringIO())

    assert not RegisteredModel.objects.exists()


@pytest.mark.django_db
def test_make_demo_models_refuses_an_empty_export_dir_instead_of_writing_into_the_working_directory():
    with pytest.raises(CommandError, match="--export-dir"):
        call_command("make_demo_models", "--export-dir", "", stdout=io.StringIO())

    assert not list(Path.cwd().glob("digits-demo-*.onnx"))


def test_make_demo_models_run_twice_at_once_registers_each_version_once(tmp_path):
    assert manage(tmp_path, "migrate", "-v0").returncode == 0
    env = environment(tmp_path, BENCHMARK_ENABLED="false")
    runs = [subprocess.Popen([sys.executable, "manage.py", "make_demo_models", "--versions", "1"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        results = [run.communicate(timeout=180) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()

    assert [run.returncode for run in runs] == [0, 0], results
    with sqlite3.connect(tmp_path / "data" / "db.sqlite3") as database:
        (versions,) = database.execute(f"SELECT COUNT(*) FROM {ModelVersion._meta.db_table}").fetchone()
    assert versions == 1, results


# ---------------------------------------------------------------- serve


@pytest.mark.parametrize("port", ["0", "-1", "70000"])
def test_serve_refuses_a_port_out_of_range(tmp_path, port):
    finished = manage(tmp_path, "serve", "--port", port, timeout=30, CONSOLE_URL="http://127.0.0.1:9")

    assert finished.returncode == 2, finished.stderr
    assert "expected a port number from 1 to 65535" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_serve_refuses_a_public_url_that_is_not_http(tmp_path):
    finished = manage(tmp_path, "serve", "--port", str(free_port()), "--public-url", "not-a-url", timeout=30,
                      CONSOLE_URL="http://127.0.0.1:9")

    assert finished.returncode == 2, finished.stderr
    assert "--public-url" in finished.stderr and "expected an http:// or https:// URL" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_serve_refuses_a_taken_port_before_the_console_hears_of_it(tmp_path):
    # It loaded its models and reported to the console, then died on the bind: the console
    # listed a second, stopped worker at the URL of the one serving there.
    with socket.create_server(("127.0.0.1", 0)) as taken, socket.create_server(("127.0.0.1", 0)) as console:
        port = taken.getsockname()[1]
        finished = manage(tmp_path, "serve", "--port", str(port), timeout=30, CONSOLE_URL=f"http://127.0.0.1:{console.getsockname()[1]}")
        console.setblocking(False)
        with pytest.raises(BlockingIOError):
            console.accept()  # nobody called

    refused(finished, f"127.0.0.1:{port} is not free")
    assert "each worker needs a port of its own" in finished.stderr


@pytest.mark.parametrize("content", [None, b"not json", b"[1, 2]"], ids=["missing", "not json", "not an object"])
def test_serve_refuses_a_state_file_it_cannot_read_before_loading_anything(tmp_path, content):
    state_file = tmp_path / "state.json"
    if content is not None:
        state_file.write_bytes(content)

    finished = manage(tmp_path, "serve", "--port", str(free_port()), "--state-file", str(state_file), timeout=30)

    refused(finished, str(state_file))
    assert not (tmp_path / "cache").exists()


def test_serve_names_the_recorded_console_address_not_an_unset_console_url_when_it_is_unusable(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "console-url").write_text("garbage here\n")  # what runstack records, damaged

    finished = manage(tmp_path, "serve", "--port", str(free_port()), timeout=30)

    refused(finished, "the console address recorded in DATA_DIR=")
    assert "CONSOLE_URL='garbage here'" not in finished.stderr


# ---------------------------------------------------------------- runstack


def test_runstack_refuses_a_host_that_is_not_an_address_here_without_blaming_another_stack(tmp_path):
    finished = manage(tmp_path, "runstack", "--no-demo", "--host", "no-such-host.invalid", "--port", str(free_port()),
                      "--serving-port", str(free_port()))

    refused(finished, "no-such-host.invalid")
    assert "another stack" not in finished.stderr
    assert not (tmp_path / "data" / "redis").exists()


@contextlib.contextmanager
def default_ports_held():
    """8000 and 8001 taken (by us, or already by something else): a runstack that ignored
    the port variables refuses at once instead of starting a stack a timeout would orphan."""
    with contextlib.ExitStack() as held:
        for port in (8000, 8001):
            with contextlib.suppress(OSError):
                held.enter_context(socket.create_server(("127.0.0.1", port)))
        yield


@pytest.mark.parametrize("variable", ["CONSOLE_PORT", "SERVING_PORT"])
def test_runstack_takes_its_ports_from_the_environment(tmp_path, variable):
    # make run had no way to choose a port: only `manage.py runstack --port` did.
    other = "SERVING_PORT" if variable == "CONSOLE_PORT" else "CONSOLE_PORT"
    with socket.create_server(("127.0.0.1", 0)) as taken, default_ports_held():
        port = taken.getsockname()[1]
        finished = manage(tmp_path, "runstack", "--no-demo", **{variable: str(port), other: str(free_port())})

    refused(finished, f"127.0.0.1:{port} is not free")


def test_runstack_refuses_a_console_port_that_is_not_a_port_naming_it(tmp_path):
    finished = manage(tmp_path, "runstack", "--no-demo", CONSOLE_PORT="80800")

    assert finished.returncode == 1, finished.stderr
    assert "CONSOLE_PORT='80800': expected a port number from 1 to 65535" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_runstack_help_answers_whatever_a_port_variable_holds(tmp_path):
    # Read when the parser was built, a bad CONSOLE_PORT refused --help and --port 9000 alike.
    finished = manage(tmp_path, "runstack", "--help", CONSOLE_PORT="abc")

    assert finished.returncode == 0, finished.stderr


def test_runstack_refuses_a_serving_port_that_is_not_a_number_naming_it(tmp_path):
    finished = manage(tmp_path, "runstack", "--no-demo", SERVING_PORT="abc")

    assert finished.returncode == 1, finished.stderr
    assert "SERVING_PORT='abc': expected a port number from 1 to 65535" in finished.stderr


def test_runstack_refuses_an_embedded_redis_port_that_is_the_consoles(tmp_path):
    port = free_port()
    finished = manage(tmp_path, "runstack", "--no-demo", "--port", str(port), "--serving-port", str(free_port()),
                      EMBEDDED_REDIS_PORT=str(port))

    refused(finished, f"EMBEDDED_REDIS_PORT={port} is the console's or the worker's port")
    assert not (tmp_path / "data" / "redis").exists()


def test_runstack_refuses_an_embedded_redis_port_already_taken_before_anything_starts(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:  # listens, never answers: a PING there waited out its timeout
        redis_port = taken.getsockname()[1]
        finished = manage(tmp_path, "runstack", "--no-demo", "--port", str(free_port()), "--serving-port", str(free_port()),
                          EMBEDDED_REDIS_PORT=str(redis_port))

    refused(finished, "EMBEDDED_REDIS_PORT")
    assert f"127.0.0.1:{redis_port} is not free" in finished.stderr
    assert not (tmp_path / "data" / "redis").exists()


@pytest.mark.integration
def test_runstack_on_the_ipv6_loopback_comes_up_with_bracketed_urls(tmp_path):
    """``::1`` is one of the loopback hosts it knows; its URLs must read http://[::1]:PORT."""
    port, serving_port = free_port(), free_port()
    errors = tmp_path / "stderr.log"
    stack = subprocess.Popen([sys.executable, "manage.py", "runstack", "--no-demo", "--host", "::1", "--port", str(port),
                              "--serving-port", str(serving_port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=errors.open("w"),
                             env=environment(tmp_path, EMBEDDED_REDIS_PORT=str(free_port())))
    children: list[int] = []
    try:
        worker_url = f"http://[::1]:{serving_port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and stack.poll() is None and _registered_url(tmp_path) != worker_url:
            time.sleep(0.5)
        children = [child.pid for child in psutil.Process(stack.pid).children(recursive=True)] if stack.poll() is None else []
        assert stack.poll() is None, errors.read_text()[-3000:]
        assert _registered_url(tmp_path) == worker_url, errors.read_text()[-3000:]
        assert (tmp_path / "data" / "console-url").read_text().strip() == f"http://[::1]:{port}"
    finally:
        if stack.poll() is None:
            stack.terminate()
            try:
                stack.wait(timeout=60)
            except subprocess.TimeoutExpired:
                stack.kill()
                stack.wait(timeout=10)
        for pid in children:  # by PID: only what this test's stack started and left
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # ended by itself, as it should have
    assert "Traceback" not in errors.read_text()


def _registered_url(tmp_path: Path) -> str | None:
    """The URL the stack's serving worker reported to its console, once it has."""
    try:
        with sqlite3.connect(f"file:{tmp_path / 'data' / 'db.sqlite3'}?mode=ro", uri=True, timeout=1) as database:
            row = database.execute("SELECT url FROM registry_worker").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


# ---------------------------------------------------------------- settings read by every command and the worker


def test_a_secret_file_that_is_not_text_is_named_instead_of_a_traceback(tmp_path):
    (tmp_path / "token.bin").write_bytes(b"\x00\xd0\xff binary")

    finished = manage(tmp_path, "forget_worker", "w1", SERVING_WORKER_TOKEN_FILE=str(tmp_path / "token.bin"))

    refused(finished, "SERVING_WORKER_TOKEN_FILE=")
    assert "not UTF-8 text" in finished.stderr


# ---------------------------------------------------------------- serve: a state file it cannot use


def test_serve_exits_2_for_a_state_file_it_cannot_read_as_for_one_it_cannot_apply(tmp_path):
    finished = manage(tmp_path, "serve", "--port", str(free_port()), "--state-file", str(tmp_path / "no-such-state.json"), timeout=30)

    assert finished.returncode == 2, finished.stderr


@pytest.mark.parametrize("contract", [None, CONTRACT_VERSION + 1], ids=["no contract", "another contract version"])
def test_serve_refuses_a_state_file_it_cannot_apply_with_exit_2_and_one_line_naming_it(tmp_path, contract):
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps({} if contract is None else {"contract": contract, "generation": 1, "models": {}}))

    finished = manage(tmp_path, "serve", "--port", str(free_port()), "--state-file", str(state_file), timeout=60)

    assert finished.returncode == 2, finished.stderr
    assert "Traceback" not in finished.stderr
    lines = [json.loads(line) for line in finished.stderr.splitlines()]  # the worker's JSON log lines, that one too
    assert [line["event"] for line in lines if str(state_file) in json.dumps(line)] == ["bad_state_file"], finished.stderr
    assert f"this side speaks contract {CONTRACT_VERSION}" in lines[-1]["reason"], finished.stderr


def test_a_command_run_against_a_database_with_no_tables_says_so_and_how_to_point_it_at_the_stack(tmp_path):
    # Run without the stack's DATA_DIR, it ended in a traceback: "no such table: auth_user".
    result = manage(tmp_path, "drf_create_token", "admin")

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"manage.py: the SQLite database {tmp_path / 'data' / 'db.sqlite3'} lacks a table this command needs "
                                    "(no such table: auth_user)")
    assert "set DATA_DIR (or DATABASE_URL) to the one the stack runs with, or run `manage.py migrate`" in result.stderr
