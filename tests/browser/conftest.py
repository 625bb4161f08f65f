"""The browser suite's stack: the real console (uvicorn, ASGI, websockets), one real
serving worker with its control plane, a Celery worker (an upload's validation job), the
test command's Redis, and a database of its own, started the way ``manage.py runstack``
starts them; and Debian's Chromium driven by Playwright.

The database belongs to the stack, not to pytest-django: a SQLite file in a temporary
DATA_DIR, or, when DATABASE_URL names PostgreSQL (CI), a ``<name>_browser`` database
created here and dropped afterwards.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import pytest

from console import embedded_redis
from console.processes import CONSOLE_HTTP_OPTIONS, stop_all, wait_http

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
WORKER_ID = "browser-worker"
PASSWORDS = {"olivia": "operator", "victor": "viewer"}  # user -> group; password is "pw-<user>"

# Runs in one `manage.py shell` so Django starts once: schema, demo v1 (both files
# exported for the upload), and the personas.
PREPARE = """
from pathlib import Path
from django.contrib.auth.models import Group, User
from django.core.management import call_command
call_command("migrate", interactive=False, verbosity=0)
call_command("make_demo_models", versions=1, export_dir=Path({export_dir!r}), verbosity=0)
for name, group in {users!r}.items():
    user = User.objects.create_user(name, password="pw-" + name)
    user.groups.add(Group.objects.get(name=group))
User.objects.create_superuser("ada", "", "pw-ada")
"""


@dataclass
class Stack:
    console_url: str
    worker_url: str
    export_dir: Path
    data_dir: Path
    env: dict
    processes: list = field(default_factory=list)

    def screenshot(self, page, name: str) -> Path:
        """Full-page screenshots under test-artifacts/, named for what they show."""
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"the browser tests need Debian's Chromium at {CHROMIUM}: run `make browser` (apt-get install chromium)")
    data_dir = tmp_path_factory.mktemp("browser-stack")
    redis_process, redis_url = _redis(data_dir)
    database_url, drop_database = _database()
    env = _environment(data_dir, redis_url, database_url)
    stack = Stack(console_url="", worker_url="", export_dir=data_dir / "export", data_dir=data_dir, env=env)
    try:
        _prepare(stack)
        _start(stack)
        yield stack
    finally:
        stop_all(stack.processes)
        _keep_logs(data_dir)
        if redis_process is not None:
            embedded_redis.stop(redis_process)
        drop_database()


@pytest.fixture(scope="session")
def browser(stack):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, stack):
    """A fresh browser context (no cookies) at laptop size; errors in the page fail the test."""
    context = browser.new_context(viewport={"width": 1440, "height": 900}, base_url=stack.console_url)
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == [], f"JavaScript errors in the page: {errors}"


def sign_in(page, username: str) -> None:
    page.goto("/login/")
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/")


# ---------------------------------------------------------------- services


def _redis(data_dir: Path):
    """The test command always sets REDIS_URL; a bare `pytest` gets an embedded one."""
    url = os.environ.get("REDIS_URL")
    if url:
        return None, url
    return embedded_redis.start(data_dir / "redis")


def _database() -> tuple[str | None, callable]:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        return None, lambda: None
    import psycopg
    from psycopg import sql

    parsed = urlparse(url)
    name = f"{parsed.path.lstrip('/') or 'modelops'}_browser"
    maintenance = urlunparse(parsed._replace(path="/postgres"))

    def run(statement: str) -> None:
        with psycopg.connect(maintenance, autocommit=True) as connection:
            connection.execute(sql.SQL(statement).format(sql.Identifier(name)))

    run("DROP DATABASE IF EXISTS {} WITH (FORCE)")
    run("CREATE DATABASE {}")
    return urlunparse(parsed._replace(path=f"/{name}")), lambda: run("DROP DATABASE IF EXISTS {} WITH (FORCE)")


def _environment(data_dir: Path, redis_url: str, database_url: str | None) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "DJANGO_SECRET_KEY", "SERVING_WORKER_TOKEN_FILE"}}
    env.update({
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "DATA_DIR": str(data_dir),
        "REDIS_URL": redis_url,
        "SERVING_WORKER_TOKEN": secrets.token_urlsafe(24),
        "SERVING_WORKER_ID": WORKER_ID,
        # Channels groups ("serving", "live") are shared by everyone on a Redis database:
        # a prefix of its own keeps other stacks' states away from this stack's worker.
        "CHANNEL_LAYER_PREFIX": f"browser-{secrets.token_hex(4)}",
        "SERVING_DEVICE": "cpu",
        "BENCHMARK_SECONDS_PER_SIZE": "0.1",  # each ready version is benchmarked: briefly, beside the browser
        "SERVING_CACHE_DIR": str(data_dir / "serving-cache"),
        "PYTHONUNBUFFERED": "1",
    })
    if database_url:
        env["DATABASE_URL"] = database_url
    return env


def _prepare(stack: Stack) -> None:
    django_shell(stack, PREPARE.format(export_dir=str(stack.export_dir), users=PASSWORDS), timeout_s=180)


def django_shell(stack: Stack, script: str, *, timeout_s: float = 60) -> str:
    """Run ``script`` in ``manage.py shell`` against the stack's own database and
    services (what a Celery task would do there); its standard output."""
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=stack.env, capture_output=True, text=True,
                            timeout=timeout_s, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"manage.py shell failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def _start(stack: Stack) -> None:
    console_port, worker_port = embedded_redis.free_port(), embedded_redis.free_port()
    stack.console_url = f"http://127.0.0.1:{console_port}"
    stack.worker_url = f"http://127.0.0.1:{worker_port}"
    stack.env.update({"CONSOLE_URL": stack.console_url, "SERVING_PUBLIC_URL": stack.worker_url})
    console = _spawn(stack, "console", [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1", "--port", str(console_port),
                                        "--no-access-log", *CONSOLE_HTTP_OPTIONS])
    wait_http(f"{stack.console_url}/healthz", console)
    worker = _spawn(stack, "worker", [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(worker_port)])
    wait_http(f"{stack.worker_url}/v2/health/ready", worker)
    # Uploads are validated by a job: a Celery worker runs it (no beat: the tests drive
    # the rollout analysis themselves). No --purge: this stack's queues are its own (its
    # CHANNEL_LAYER_PREFIX), and they hold the demo's benchmark and evaluation jobs.
    celery = _spawn(stack, "celery", [sys.executable, "-m", "celery", "-A", "console", "worker", "--queues", "celery,jobs", "--concurrency", "1",
                                      "--loglevel", "INFO", "--without-mingle", "--without-gossip"])
    wait_log(stack.data_dir / "celery.log", " ready.", celery)


def wait_log(path: Path, text: str, process: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{path.stem} exited with {process.returncode}:\n{path.read_text(errors='replace')[-3000:]}")
        if text in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{path.stem} did not log {text!r} within {timeout_s} s:\n{path.read_text(errors='replace')[-3000:]}")


def _spawn(stack: Stack, name: str, command: list[str]) -> subprocess.Popen:
    log = open(stack.data_dir / f"{name}.log", "wb")
    process = subprocess.Popen(command, cwd=ROOT, env=stack.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    stack.processes.append(process)
    return process


def _keep_logs(data_dir: Path) -> None:
    """The processes' logs go next to the screenshots, for whoever reads a failure."""
    target = ARTIFACTS / "browser-logs"
    target.mkdir(parents=True, exist_ok=True)
    for log in data_dir.glob("*.log"):
        shutil.copy(log, target / log.name)
