"""A worker restarted while the console cannot answer serves the state it last applied,
persisted beside its artifact cache, once that state passes its checks; a persisted file
whose content changed is refused (nothing served from it, the reason logged, no crash);
when the console answers again the worker reconciles with it."""

from __future__ import annotations

import json
import stat
import sys
import time
from urllib.parse import urlsplit

import httpx
import pytest
from django.db import connection

from console.processes import CONSOLE_HTTP_OPTIONS
from tools.stack import running_stack, wait_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROW = [0.5] * 16
WORKER_ID = "worker-restarted"
RECONCILE_INTERVAL_S = "30"  # the return of the console must be noticed without this timer
SPLIT = [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]


@pytest.fixture
def stack(tmp_path, settings, model):
    with running_stack(tmp_path, settings, connection.settings_dict, SERVING_RECONCILE_INTERVAL_S=RECONCILE_INTERVAL_S) as stack:
        yield stack


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "worker-cache"


def start_worker(stack, cache_dir, *, wait_ready: bool = True):
    return stack.start_worker(wait_ready=wait_ready, SERVING_WORKER_ID=WORKER_ID, SERVING_CACHE_DIR=str(cache_dir))


def restart_console(stack, url: str) -> None:
    """The console again on the same address: the worker's CONSOLE_URL does not change."""
    command = [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1", "--port", str(urlsplit(url).port), "--no-access-log",
               *CONSOLE_HTTP_OPTIONS]
    stack.console = stack._spawn("console-again", command, url, {})
    wait_http(stack.console, "/healthz")


def issued(stack, settings) -> dict:
    return httpx.get(stack.console.url + "/api/serving/state", headers={"Authorization": f"Bearer {settings.SERVING_WORKER_TOKEN}"}, timeout=10).json()


def reported(api, digest: str) -> bool:
    return any(row["worker_id"] == WORKER_ID and row["digest"] == digest for row in api.get("/api/workers/").json())


def predict(worker) -> httpx.Response:
    return httpx.post(worker.url + "/predict", json={"model_name": "tiny", "inputs": [ROW]}, timeout=10)


def routes_of(worker) -> list:
    return httpx.get(worker.url + "/v2/models/tiny", timeout=5).json()["parameters"]["routes"]


def serve_then_stop_everything(stack, api, settings, cache_dir) -> tuple[str, dict]:
    """A worker that applied the console's state (v1), then a split made while it is
    stopped, then the console stopped too. Returns the console's URL and the state the
    worker applied."""
    worker = start_worker(stack, cache_dir)
    applied = issued(stack, settings)
    assert wait_until(lambda: reported(api, applied["digest"]), 10)
    assert predict(worker).json()["model_version"] == 1
    worker.stop()
    assert api.post("/api/models/tiny/release/", json={"routes": SPLIT}).status_code == 201
    url = stack.console.url
    stack.console.stop()
    return url, applied


def test_a_worker_started_while_the_console_is_down_serves_its_persisted_state_then_reconciles(stack, api, settings, cache_dir):
    url, applied = serve_then_stop_everything(stack, api, settings, cache_dir)

    started = time.monotonic()
    worker = start_worker(stack, cache_dir, wait_ready=False)
    assert wait_until(lambda: httpx.get(worker.url + "/v2/health/ready", timeout=2).status_code == 200, 20), worker.log()
    ready_s = time.monotonic() - started
    answers = [predict(worker) for _ in range(20)]
    health = httpx.get(worker.url + "/health", timeout=5).json()

    assert [(answer.status_code, answer.json()["model_version"]) for answer in answers] == [(200, 1)] * 20
    assert health["generation"] == applied["generation"]
    assert routes_of(worker) == [{"version": 1, "weight": 100}]
    assert '"event": "serving_persisted_state"' in worker.log() and applied["digest"] in worker.log()
    assert stat.S_IMODE((cache_dir / "applied-state.json").stat().st_mode) == 0o600

    restart_console(stack, url)
    back = time.monotonic()
    now = issued(stack, settings)
    assert wait_until(lambda: reported(api, now["digest"]), 10), api.get("/api/workers/?all=1").json()
    converged_s = time.monotonic() - back
    assert routes_of(worker) == SPLIT
    assert worker.popen.poll() is None
    print(f"console down: ready {ready_s:.2f} s after start on the persisted state, {len(answers)} of {len(answers)} answered 200; "
          f"serving the console's state {converged_s:.2f} s after the console answered again")


def test_a_persisted_state_changed_on_disk_is_refused_and_the_worker_waits_for_the_console(stack, api, settings, cache_dir):
    url, _ = serve_then_stop_everything(stack, api, settings, cache_dir)
    persisted = cache_dir / "applied-state.json"
    document = json.loads(persisted.read_text())
    document["models"]["tiny"]["routes"][0]["weight"] = 0  # the digest and signature stay: stale
    persisted.write_text(json.dumps(document))

    worker = start_worker(stack, cache_dir, wait_ready=False)
    assert wait_until(lambda: "persisted_state_refused" in worker.log(), 20), worker.log()
    time.sleep(1.0)  # a second of reconcile retries against the absent console

    assert httpx.get(worker.url + "/v2/health/ready", timeout=2).status_code == 503
    assert predict(worker).status_code == 503
    assert httpx.get(worker.url + "/health", timeout=5).json()["generation"] is None
    assert "the digest does not match the content" in worker.log()
    assert worker.popen.poll() is None

    restart_console(stack, url)
    now = issued(stack, settings)
    assert wait_until(lambda: reported(api, now["digest"]), 10), api.get("/api/workers/?all=1").json()
    assert httpx.get(worker.url + "/v2/health/ready", timeout=2).status_code == 200
    assert routes_of(worker) == SPLIT
    assert json.loads(persisted.read_text())["digest"] == now["digest"]  # the refused file is replaced by the state applied
