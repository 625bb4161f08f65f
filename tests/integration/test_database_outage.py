"""PostgreSQL stopped under a live stack: serving goes on, the console answers 503 with
``Retry-After`` (API and pages alike), readiness names the database, and everything
recovers when the database returns, with no restart.

The test starts its own PostgreSQL cluster (tests/fixtures/postgres_cluster.py), so it can
stop it without touching the machine's shared database.
"""

from __future__ import annotations

import collections
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Self

import httpx
import pytest

from serving.contract import CONTRACT_VERSION
from tools.stack import REPO_ROOT, Stack, make_stack, wait_until

pytestmark = [pytest.mark.integration]

ROW = [0.5] * 16
SEED_TIMEOUT_S = 120
READINESS_BOUND_S = 3.0
OUTAGE_PREDICTIONS = 50  # answered by the worker while the database is down
OUTAGE_S = 3.0  # and down at least this long: six of the worker's reports refused
CONNECT_TIMEOUT_S = 3  # DATABASE_CONNECT_TIMEOUT_S, its default

SEED = """
import io
from django.contrib.auth.models import Group, User
from rest_framework.authtoken.models import Token
from registry.actions import uploads
from registry.models import RegisteredModel
from registry.building.onnx_build import random_mlp, to_bytes
user = User.objects.create_user("olivia", "", "pw-olivia-outage")
user.groups.add(Group.objects.get_or_create(name="operator")[0])
model = RegisteredModel.objects.create(name="tiny")
uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([16, 8, 4], seed=1))), uploaded_by=user)
print("TOKEN=" + Token.objects.create(user=user).key)
"""


@pytest.fixture
def stack(tmp_path, settings, postgres_cluster) -> Iterator[Stack]:
    stack = make_stack(tmp_path, settings, postgres_cluster.settings_dict, SECURE_COOKIES="false")
    try:
        yield stack
    finally:
        stack.stop()
        for process in [stack.console, *stack.workers]:
            if process is not None:
                print(f"--- {process.name} ---\n{process.log()}")
        print(f"--- postgres ---\n{postgres_cluster.log()}")


def manage(stack: Stack, *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], check=False, cwd=REPO_ROOT, env=stack.env, capture_output=True, text=True, timeout=SEED_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def seeded_token(stack: Stack) -> str:
    manage(stack, "migrate", "--noinput", "-v", "0")
    output = manage(stack, "shell", "-c", SEED)
    return next(line.removeprefix("TOKEN=") for line in output.splitlines() if line.startswith("TOKEN="))


def signed_in(console_url: str) -> httpx.Client:
    client = httpx.Client(base_url=console_url, timeout=10)
    client.get("/login/")
    response = client.post("/login/", data={"username": "olivia", "password": "pw-olivia-outage", "csrfmiddlewaretoken": client.cookies["csrftoken"]})
    assert response.status_code == 302, response.text[:500]
    return client


class PredictionLoad:
    """Predictions sent one after another on a thread, every status counted."""

    def __init__(self, worker_url: str):
        self.statuses: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(worker_url,), daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self, worker_url: str) -> None:
        with httpx.Client(base_url=worker_url, timeout=5) as client:
            while not self._stop.is_set():
                try:
                    self.statuses[client.post("/predict", json={"model_name": "tiny", "inputs": [ROW]}).status_code] += 1
                except httpx.HTTPError as error:
                    self.statuses[type(error).__name__] += 1
                time.sleep(0.01)


def test_database_outage_answers_503_keeps_serving_and_recovers_without_restart(stack, postgres_cluster):
    token = seeded_token(stack)
    console = stack.start_console()
    worker = stack.start_worker()
    api = httpx.Client(base_url=console.url, headers={"Authorization": f"Token {token}"}, timeout=10)
    page = signed_in(console.url)
    assert wait_until(lambda: httpx.post(worker.url + "/predict", json={"model_name": "tiny", "inputs": [ROW]}, timeout=5).status_code == 200, 10)
    assert api.get("/api/models/").status_code == 200
    assert httpx.get(console.url + "/readyz", timeout=5).json() == {"ready": True, "database": {"ok": True}, "redis": {"ok": True}}

    with PredictionLoad(worker.url) as load:
        postgres_cluster.stop()
        stopped = time.monotonic()

        models = api.get("/api/models/")
        first_503_s = time.monotonic() - stopped
        assert models.status_code == 503, models.text[:500]
        assert models.headers["Content-Type"] == "application/json"
        assert int(models.headers["Retry-After"]) > 0
        assert "database is unavailable" in models.json()["error"]

        models_page = page.get("/")
        assert models_page.status_code == 503, models_page.text[:500]
        assert models_page.headers["Content-Type"].startswith("text/html")
        assert int(models_page.headers["Retry-After"]) > 0
        assert "database is unavailable" in models_page.text

        started = time.monotonic()
        readiness = httpx.get(console.url + "/readyz", timeout=10)
        readiness_s = time.monotonic() - started
        assert readiness_s < READINESS_BOUND_S
        assert readiness.status_code == 503
        assert readiness.json()["ready"] is False
        assert readiness.json()["database"]["ok"] is False
        assert readiness.json()["redis"] == {"ok": True}
        assert httpx.get(console.url + "/healthz", timeout=5).status_code == 200
        answered_before = load.statuses[200]
        assert wait_until(lambda: load.statuses[200] >= answered_before + OUTAGE_PREDICTIONS and time.monotonic() - stopped >= OUTAGE_S, 10), load.statuses

        outage_s = time.monotonic() - stopped
        postgres_cluster.start()  # returns once PostgreSQL accepts connections
        started = time.monotonic()
        recovered = api.get("/api/models/")
        recovery_s = time.monotonic() - started

    print(f"first API 503 {first_503_s:.3f} s after the stop; readyz {readiness_s:.3f} s; outage {outage_s:.1f} s; "
          f"first API answer after the restart {recovery_s:.3f} s; predictions {dict(load.statuses)}")

    assert recovered.status_code == 200, recovered.text[:500]  # the very next request
    assert page.get("/").status_code == 200  # the session outlived the outage
    assert httpx.get(console.url + "/readyz", timeout=5).status_code == 200
    assert console.popen.poll() is None  # the same console process, never restarted
    assert set(load.statuses) == {200}, load.statuses


@pytest.fixture
def silent_database_port() -> Iterator[int]:
    """A loopback port whose kernel completes TCP handshakes and then nothing ever
    answers: a database host that hangs, the case a connect timeout exists for."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


def test_readiness_and_api_answer_in_bounded_time_when_the_database_hangs(tmp_path, settings, silent_database_port):
    silent = {"ENGINE": "django.db.backends.postgresql", "NAME": "postgres", "USER": "postgres", "HOST": "127.0.0.1", "PORT": silent_database_port}
    stack = make_stack(tmp_path, settings, silent, DATABASE_CONNECT_TIMEOUT_S=str(CONNECT_TIMEOUT_S))
    console = stack.start_console()
    readiness_s = models_s = float("nan")
    try:
        started = time.monotonic()
        readiness = httpx.get(console.url + "/readyz", timeout=10)
        readiness_s = time.monotonic() - started
        started = time.monotonic()
        models = httpx.get(console.url + "/api/models/", headers={"Authorization": "Token " + "0" * 40}, timeout=20)
        models_s = time.monotonic() - started
    finally:
        stack.stop()
        print(f"--- console (readyz {readiness_s:.2f} s, API {models_s:.2f} s) ---\n{console.log()}")

    assert readiness.status_code == 503
    assert readiness.json() == {"ready": False, "database": {"ok": False, "error": "no answer within 2 s"}, "redis": {"ok": True}}
    assert readiness_s < READINESS_BOUND_S
    assert models.status_code == 503
    assert int(models.headers["Retry-After"]) > 0
    assert CONNECT_TIMEOUT_S - 0.5 < models_s < CONNECT_TIMEOUT_S + 2


SECOND_VERSION = """
import io
from django.contrib.auth.models import User
from registry.actions import uploads
from registry.models import RegisteredModel
from registry.building.onnx_build import random_mlp, to_bytes
uploads.register_stream(RegisteredModel.objects.get(name="tiny"), io.BytesIO(to_bytes(random_mlp([16, 8, 4], seed=2))),
                        uploaded_by=User.objects.get(username="olivia"))
"""
DRILL_WAIT_S = 6  # DRILL_ACK_TIMEOUT_S: how long the drill waits for acks, and for the database to come back


def test_a_drill_the_database_outage_interrupts_is_finished_as_failed_and_rolled_forward_when_it_returns(stack, postgres_cluster):
    stack.env["DRILL_ACK_TIMEOUT_S"] = str(DRILL_WAIT_S)
    token = seeded_token(stack)
    manage(stack, "shell", "-c", SECOND_VERSION)
    console = stack.start_console()
    stack.start_worker()
    api = httpx.Client(base_url=console.url, headers={"Authorization": f"Token {token}"}, timeout=60)
    canary = api.post("/api/models/tiny/release/", json={"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]})
    assert canary.status_code == 201, canary.text
    # A live worker that never acks holds the drill in its measurement while the database goes.
    ghost = httpx.post(console.url + "/api/serving/reports", headers={"Authorization": f"Bearer {stack.env['SERVING_WORKER_TOKEN']}"},
                       json={"worker": {"id": "ghost", "host": "box"}, "generation": None, "contract": CONTRACT_VERSION}, timeout=10)
    assert ghost.status_code == 204, ghost.text
    answer: dict = {}
    drill = threading.Thread(target=lambda: answer.update(response=api.post("/api/models/tiny/drills/", json={})))
    drill.start()
    assert wait_until(lambda: api.get("/api/models/tiny/release/").json()["release"]["action"] == "rollback", 10)

    postgres_cluster.stop()
    time.sleep(2)
    postgres_cluster.start()
    drill.join(60)

    response = answer["response"]
    assert response.status_code == 201, response.text[:500]
    assert response.json()["status"] == "failed"
    assert response.json()["error"] == "the database became unavailable during the drill, so it could not be measured"
    current = api.get("/api/models/tiny/release/").json()["release"]
    assert current["action"] == "restore"  # rolled forward: the canary is back
    assert [(route["version"], route["weight"]) for route in current["routes"]] == [(1, 90), (2, 10)]
    stored = api.get("/api/models/tiny/drills/").json()
    stored = stored["results"] if isinstance(stored, dict) else stored
    assert [(row["status"], row["finished_at"] is not None) for row in stored] == [("failed", True)]
    assert console.popen.poll() is None  # the same console process all along
