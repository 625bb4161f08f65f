"""A drill the console is stopped during (SIGTERM: Ctrl-C, compose stop, a Kubernetes
rolling update), with a real uvicorn console and real workers: uvicorn finishes the drill's
request while it stops, but it closed its listening socket first, so no report or ack of a
worker reaches it any more. The drill says so, blames no worker and still rolls forward."""

from __future__ import annotations

import signal
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from tools.stack import running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

DRILL_WAIT_S = 4  # DRILL_ACK_TIMEOUT_S
CANARY = [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
STOPPED = "the console stopped during the drill"
# Words that put a worker's silence on the worker ("stopped reporting", "no report showed
# it serving"): each was said of workers that followed at once, only unheard.
BLAME = ("never confirmed", "no report showed", "stopped reporting", "has not reported", "fell silent", "did not follow")


@pytest.fixture
def stack(tmp_path, settings, model):
    # Reports every 10 s: the rollback's arrives after the stop, as a report in flight at a
    # real stop does (1 s apart by default, and the drill answered at 0.25 s).
    with running_stack(tmp_path, settings, connection.settings_dict, DRILL_ACK_TIMEOUT_S=str(DRILL_WAIT_S), WORKER_GONE_AFTER_S="30",
                       SERVING_REPORT_INTERVAL_S="10") as stack:
        yield stack


def api_client(stack, operator) -> httpx.Client:
    token, _ = Token.objects.get_or_create(user=operator)
    return httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Token {token.key}"}, timeout=60)


def acked(api: httpx.Client, generation: int, count: int) -> bool:
    rows = api.get("/api/models/tiny/release/").json()["workers"]
    return len([row for row in rows if row["generation"] >= generation and row["ok"]]) == count


def test_a_drill_the_console_is_stopped_during_says_so_blames_no_worker_and_rolls_forward(stack, operator):
    stack.start_worker()
    stack.start_worker()
    api = api_client(stack, operator)
    canary = api.post("/api/models/tiny/release/", json={"routes": CANARY}).json()["release"]["generation"]
    assert wait_until(lambda: acked(api, canary, 2), 10)
    console, port = stack.console, urlsplit(stack.console.url).port
    answer: dict = {}
    drill = threading.Thread(target=lambda: answer.update(response=api.post("/api/models/tiny/drills/", json={"roll_forward": True})))

    drill.start()
    assert wait_until(lambda: httpx.get(console.url + "/api/models/tiny/release/", headers=api.headers, timeout=5)
                      .json()["release"]["action"] == "rollback", 10, 0.02)
    console.popen.send_signal(signal.SIGTERM)  # by its PID: uvicorn's graceful stop
    stopping = time.monotonic()
    drill.join(3 * DRILL_WAIT_S + 10)
    console.popen.wait(timeout=10)  # it stopped once the drill's request was answered
    stop_s = time.monotonic() - stopping

    response = answer["response"]
    assert response.status_code == 201, response.text[:500]
    # Not held by waits for workers it can no longer hear: a stop's grace (compose: 10 s,
    # then SIGKILL) is spent before the roll forward otherwise.
    assert stop_s < DRILL_WAIT_S
    stack.start_console(port=port)  # on the same database: what the drill recorded
    api = api_client(stack, operator)
    [stored] = api.get("/api/models/tiny/drills/").json()
    assert stored["id"] == response.json()["id"]
    assert stored["status"] == "failed"
    assert stored["error"].startswith(f"{STOPPED} (it stopped taking the workers' reports and acks "), stored["error"]
    assert ", so it could not be measured" in stored["error"]
    assert not [words for words in BLAME if words in stored["error"]], stored["error"]
    assert stored["forward_unconfirmed"] == []  # "roll forward not followed by 2" of two workers that followed it
    assert sorted(row["worker"] for row in stored["workers"]) == ["worker-0", "worker-1"]
    for row in stored["workers"]:
        assert row["confirmed_s"] is not None or row["error"].startswith("not seen: the console stopped taking reports and acks "), row
        assert row["quiet_after_confirming"] == "", row
    # Rolled forward all the same: the canary is back, and the workers serve it.
    assert stored["forward_generation"] is not None and stored["forward_pending"] is False
    current = api.get("/api/models/tiny/release/").json()["release"]
    assert (current["generation"], current["action"], current["routes"]) == (stored["forward_generation"], "restore", CANARY)
    for worker in stack.workers:
        assert httpx.get(worker.url + "/v2/models/tiny", timeout=5).json()["parameters"]["routes"] == CANARY
