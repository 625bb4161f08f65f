"""A live stack as real processes: the console under uvicorn (ASGI, Channels) on a given
database and the real Redis, serving workers as `manage.py serve` processes, and, where
asked for, a Celery worker running beat (the rollout analysis, retention) and the
background jobs (an upload's validation: ``upload_version`` waits for its verdict).

Outside tests/ because both the integration tests and the benchmarks (bench/) start it.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from console.embedded_redis import free_port  # noqa: F401 - the stack's ports, picked as runstack picks them
from console.processes import CONSOLE_HTTP_OPTIONS

REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0
VERDICT_TIMEOUT_S = 120.0  # a validation job: the queue ahead of it and INSPECTION_TIMEOUT_S




def database_url(settings_dict: dict) -> str:
    """The URL of the database pytest-django created, for the child processes."""
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    user = settings_dict.get("USER") or "postgres"
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{settings_dict.get('HOST') or '127.0.0.1'}:{settings_dict.get('PORT') or 5432}/{settings_dict['NAME']}"


@dataclass
class Process:
    name: str
    url: str
    popen: subprocess.Popen
    log_path: Path
    log_start: int = 0  # where this run's lines begin in the log (a restarted process appends)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                # Its whole session: Celery's pool children would outlive their parent.
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)


@dataclass
class Stack:
    env: dict
    work_dir: Path
    console: Process | None = None
    workers: list[Process] = field(default_factory=list)
    celery: Process | None = None
    jobs: Process | None = None  # the Celery worker of the jobs queue
    # Put before every command (e.g. ``ip netns exec NS``, which execs it: the PID stays
    # the process's own); a worker may be given its own. The waits for a process to
    # answer connect from the calling thread, which must see the address it listens on.
    command_prefix: Sequence[str] = ()

    def start_console(self, *, port: int | None = None, host: str = "127.0.0.1", **extra_env) -> Process:
        """``port``: the port of a console stopped before, so its workers find it again;
        ``host``: the address it listens on, and the one its workers are given."""
        port = port or free_port()
        command = [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", host, "--port", str(port), "--no-access-log",
                   *CONSOLE_HTTP_OPTIONS]
        self.console = self._spawn("console", command, f"http://{host}:{port}", extra_env)
        self.env["CONSOLE_URL"] = self.console.url
        wait_http(self.console, "/healthz")
        return self.console

    def start_worker(self, *, wait_ready: bool = True, host: str = "127.0.0.1", port: int | None = None,
                     command_prefix: Sequence[str] | None = None, **extra_env) -> Process:
        """A worker listening on ``host:port`` (a free loopback port by default), which it
        reports to the console as its ``--public-url``; ``command_prefix`` replaces the stack's."""
        port = port or free_port()
        index = len(self.workers)
        url = f"http://{host}:{port}"
        env = {"SERVING_WORKER_ID": f"worker-{index}", "SERVING_CACHE_DIR": str(self.work_dir / f"cache-{index}"), **extra_env}
        command = [sys.executable, "manage.py", "serve", "--host", host, "--port", str(port), "--public-url", url]
        worker = self._spawn(f"worker-{index}", command, url, env, command_prefix)
        self.workers.append(worker)
        wait_http(worker, "/v2/health/ready" if wait_ready else "/v2/health/live")
        return worker

    def start_celery(self, *, purge: bool | None = None, jobs: bool = True, **extra_env) -> Process:
        """Celery as `manage.py runstack` starts it, on this stack's database and Redis: a
        worker with beat on the default queue and (``jobs``) one on the jobs queue; returns
        once they are ready to take tasks. The beat schedule file lives in the work dir, so
        a restarted one keeps its place.

        ``purge`` (the default for this stack's first Celery worker): drop the messages
        waiting in the broker's queue first, which other runs sharing the Redis database
        left (their job ids would name this database's jobs). Start it before anything
        queues a job. A restarted worker keeps the queue: it holds this stack's jobs."""
        purge = self.celery is None if purge is None else purge
        command = [sys.executable, "-m", "celery", "-A", "console", "worker", "--beat", "--queues", "celery", "--concurrency", "1",
                   "--hostname", f"control-{os.getpid()}@%h", "--loglevel", "INFO", "--without-mingle", "--without-gossip",
                   "--schedule", str(self.work_dir / "beat-schedule"), *(["--purge"] if purge else [])]
        self.celery = self._spawn("celery", command, "", extra_env)
        if jobs and (self.jobs is None or self.jobs.popen.poll() is not None):  # a restart of beat keeps a running jobs worker
            self.start_job_worker(purge=purge, **extra_env)
        wait_log(self.celery, " ready.")
        return self.celery

    def start_job_worker(self, *, purge: bool | None = None, **extra_env) -> Process:
        """The Celery worker of the jobs queue (validation, benchmark, evaluation, batch
        inference), one job at a time; ``purge`` as in ``start_celery``."""
        purge = self.jobs is None if purge is None else purge
        command = [sys.executable, "-m", "celery", "-A", "console", "worker", "--queues", "jobs", "--concurrency", "1",
                   "--hostname", f"jobs-{os.getpid()}@%h", "--loglevel", "INFO", "--without-mingle", "--without-gossip",
                   *(["--purge"] if purge else [])]
        self.jobs = self._spawn("celery-jobs", command, "", extra_env)
        wait_log(self.jobs, " ready.")
        return self.jobs

    def stop(self) -> None:
        for process in [*self.workers, self.console, self.celery, self.jobs]:
            if process is not None:
                process.stop()

    def manage(self, *args: str) -> str:
        """``manage.py ARGS`` on this stack's database; its output."""
        command = [*self.command_prefix, sys.executable, "manage.py", *args]
        return subprocess.run(command, cwd=REPO_ROOT, env=self.env, check=True, capture_output=True, text=True).stdout

    def operator_token(self, username: str = "olivia") -> str:
        """An API token of a new user in the operator group (the migrations make the groups)."""
        code = ("from django.contrib.auth.models import Group, User; from rest_framework.authtoken.models import Token; "
                f"user = User.objects.create_user({username!r}, {username + '@example.com'!r}); "
                "user.groups.add(Group.objects.get(name='operator')); print(Token.objects.create(user=user).key)")
        return self.manage("shell", "--no-imports", "-c", code).strip().splitlines()[-1]

    def processes(self) -> list[Process]:
        return [process for process in [self.console, self.celery, self.jobs, *self.workers] if process is not None]

    def _spawn(self, name: str, command: list[str], url: str, extra_env: dict, command_prefix: Sequence[str] | None = None) -> Process:
        log_path = self.work_dir / f"{name}.log"
        command = [*(self.command_prefix if command_prefix is None else command_prefix), *command]
        with open(log_path, "ab") as log:  # a process started again (a restart) adds to its log; the child keeps its own descriptor
            log_start = log.tell()
            popen = subprocess.Popen(command, cwd=REPO_ROOT, env={**self.env, **extra_env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return Process(name, url, popen, log_path, log_start)


def make_stack(work_dir: Path, settings, db_settings: dict, *, command_prefix: Sequence[str] = (), **env) -> Stack:
    base = {
        **os.environ,
        "DATABASE_URL": database_url(db_settings),
        "DATA_DIR": str(work_dir / "data"),
        "ARTIFACT_ROOT": str(settings.ARTIFACT_ROOT),
        "SERVING_WORKER_TOKEN": settings.SERVING_WORKER_TOKEN,
        "WORKER_GONE_AFTER_S": "5",
        "SERVING_RECONCILE_INTERVAL_S": "30",  # pushes must do the work; reconcile is the safety net
        "SERVING_REPORT_INTERVAL_S": "0.5",
        "SERVING_MAX_BATCH_SIZE": "8",
        "SERVING_DEVICE": "cpu",
        "BENCHMARK_SECONDS_PER_SIZE": "0.05",  # a benchmark per ready version: short, the cores are shared
        "CHANNEL_LAYER_PREFIX": f"test-{secrets.token_hex(4)}",  # this stack's own groups
        **env,
    }
    return Stack(env=base, work_dir=work_dir, command_prefix=command_prefix)


@contextmanager
def own_database(db_settings: dict, work_dir: Path) -> Iterator[str]:
    """The URL of a new, empty database on the engine and server of ``db_settings``, for
    a stack that outlives one test (pytest-django's test database is flushed under it by
    every transactional test); a PostgreSQL one is dropped afterwards. Not migrated."""
    if db_settings["ENGINE"].endswith("sqlite3"):
        yield f"sqlite:///{work_dir / 'stack.sqlite3'}"
        return
    import psycopg  # PostgreSQL only

    name = f"stack_{os.getpid()}_{secrets.token_hex(4)}"
    server = database_url({**db_settings, "NAME": "postgres"})
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url({**db_settings, "NAME": name})
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


def wait_http(process: Process, path: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise RuntimeError(f"{process.name} exited with {process.popen.returncode}:\n{process.log()}")
        try:
            if httpx.get(process.url + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{process.name} did not answer {path} within {timeout_s} s:\n{process.log()}")


def wait_log(process: Process, text: str, timeout_s: float = START_TIMEOUT_S) -> None:
    """Wait until ``text`` appears in the part of the process's log written since it started."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise RuntimeError(f"{process.name} exited with {process.popen.returncode}:\n{process.log()}")
        with open(process.log_path, "rb") as log:
            log.seek(process.log_start)
            if text.encode() in log.read():
                return
        time.sleep(0.1)
    raise RuntimeError(f"{process.name} did not log {text!r} within {timeout_s} s:\n{process.log()}")


def upload_version(api: httpx.Client, name: str, artifact: bytes, *, timeout_s: float | None = None, **fields) -> dict:
    """Upload a version over the API and wait for its validation job's verdict (a Celery
    worker must run: ``Stack.start_celery``); the version as ``GET …/versions/{n}/`` shows it."""
    response = api.post(f"/api/models/{name}/versions/", files={"artifact": ("model.onnx", artifact, "application/octet-stream")}, data=fields)
    if response.status_code != 202:
        raise RuntimeError(f"upload to {name} answered {response.status_code}: {response.text}")
    return wait_for_verdict(api, name, response.json()["number"], timeout_s=timeout_s)


def wait_for_verdict(api: httpx.Client, name: str, number: int, *, timeout_s: float | None = None) -> dict:
    """The version once it is no longer ``validating``; RuntimeError past ``timeout_s``."""
    timeout_s = VERDICT_TIMEOUT_S if timeout_s is None else timeout_s

    def judged():
        body = api.get(f"/api/models/{name}/versions/{number}/").json()
        return body if body.get("status") != "validating" else None

    body = wait_until(judged, timeout_s, 0.1)
    if body is None:
        raise RuntimeError(f"{name} v{number} was still validating after {timeout_s} s (is a Celery worker running?)")
    return body


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; return it (or None)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    return None


@contextmanager
def running_stack(work_dir: Path, settings, db_settings: dict, *, migrate: bool = False, **env) -> Iterator[Stack]:
    """A stack with its console started; stopped afterwards, its logs printed (pytest
    shows them only when the test failed). ``migrate``: run the migrations first (a
    database of its own, e.g. ``own_database``'s, given as ``DATABASE_URL``)."""
    stack = make_stack(work_dir, settings, db_settings, **env)
    if migrate:
        stack.manage("migrate", "--verbosity", "0")
    stack.start_console()
    try:
        yield stack
    finally:
        stack.stop()
        for process in stack.processes():
            print(f"--- {process.name} ---\n{process.log()}")
