"""Gray release end to end: a live console, the real Redis, real worker processes."""

from __future__ import annotations

import collections
import threading
import time

import httpx
import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from registry.artifacts import storage
from registry.models import ModelVersion, Release
from tools.stack import make_stack, running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROW = [0.5] * 16


@pytest.fixture
def stack(tmp_path, settings, model):
    with running_stack(tmp_path, settings, connection.settings_dict, DRILL_ACK_TIMEOUT_S="4") as stack:
        yield stack


def predict(worker, **headers) -> httpx.Response:
    return httpx.post(worker.url + "/predict", json={"model_name": "tiny", "inputs": [ROW]}, headers=headers, timeout=10)


def served_versions(worker, count: int) -> collections.Counter:
    with httpx.Client(base_url=worker.url, timeout=10) as client:
        return collections.Counter(client.post("/predict", json={"model_name": "tiny", "inputs": [ROW]}).json()["model_version"] for _ in range(count))


def routes_of(worker) -> list:
    return httpx.get(worker.url + "/v2/models/tiny", timeout=5).json()["parameters"]["routes"]


def acked(api, generation: int, count: int):
    body = api.get("/api/models/tiny/release/").json()
    rows = [row for row in body["workers"] if row["generation"] >= generation and row["ok"]]
    return body if len(rows) == count else None


def test_both_workers_ack_a_split_within_two_seconds_and_serve_it(stack, api):
    workers = [stack.start_worker(), stack.start_worker()]
    assert wait_until(lambda: len(api.get("/api/workers/").json()) == 2, 10)

    started = time.monotonic()
    response = api.post("/api/models/tiny/release/", json={"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]})
    generation = response.json()["release"]["generation"]
    body = wait_until(lambda: acked(api, generation, 2), 2.0, 0.02)

    assert body is not None, api.get("/api/models/tiny/release/").json()
    assert time.monotonic() - started < 2.0
    assert body["converged"] is True
    assert wait_until(lambda: api.get("/api/models/tiny/release/").json()["rollback_ready"], 3)  # v1 alone, warm everywhere
    for worker in workers:
        assert routes_of(worker) == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
        counts = served_versions(worker, 400)
        assert set(counts) == {1, 2}
        assert 20 <= counts[2] <= 70  # 10% of 400 = 40, binomial sd ~6


def test_rollback_under_continuous_load_fails_no_request(stack, api):
    workers = [stack.start_worker(), stack.start_worker()]
    split = api.post("/api/models/tiny/release/", json={"routes": [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]})
    assert split.status_code == 201, split.text
    assert wait_until(lambda: all(routes_of(worker)[0]["weight"] == 50 for worker in workers), 5)
    stop = threading.Event()
    statuses: list[collections.Counter] = []

    def load(worker):
        # A transport error (a reset, a timeout: what a bad switch would cause) is counted, not
        # lost with a thread that died of it.
        counts = collections.Counter()
        try:
            with httpx.Client(base_url=worker.url, timeout=10) as client:
                while not stop.is_set():
                    try:
                        counts[client.post("/predict", json={"model_name": "tiny", "inputs": [ROW]}).status_code] += 1
                    except httpx.HTTPError as error:
                        counts[type(error).__name__] += 1
        finally:
            statuses.append(counts)

    threads = [threading.Thread(target=load, args=(worker,)) for worker in workers]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    generation = api.post("/api/models/tiny/release/rollback/").json()["release"]["generation"]
    assert wait_until(lambda: acked(api, generation, 2), 5, 0.02)
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join()

    total = sum(statuses, collections.Counter())
    assert len(statuses) == len(workers)
    assert set(total) == {200}, total
    assert all(counts[200] > 25 for counts in statuses), statuses  # each worker answered all along
    for worker in workers:
        assert routes_of(worker) == [{"version": 1, "weight": 100}]


def test_drill_measures_every_worker_following(stack, api):
    stack.start_worker()
    stack.start_worker()
    api.post("/api/models/tiny/release/", json={"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]})
    assert wait_until(lambda: acked(api, 2, 2), 5)

    drill = api.post("/api/models/tiny/drills/", json={"roll_forward": True}).json()

    assert drill["status"] == "passed", drill
    assert [row["ok"] for row in drill["workers"]] == [True, True]
    assert 0 < drill["first_ack_s"] <= drill["last_ack_s"] < 2
    assert drill["confirmed_s"] is not None
    assert drill["failed_requests"] == 0
    assert wait_until(lambda: Release.objects.order_by("-generation").first().routes == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], 2)
    assert api.get("/api/models/tiny/drills/").json()[0]["id"] == drill["id"]
    assert [event["kind"] for event in api.get("/api/models/tiny/audit/").json()[:2]] == ["release", "drill"]  # roll forward, drill


def test_drill_reports_a_killed_worker_as_not_acked(stack, api):
    stack.start_worker()
    doomed = stack.start_worker()
    api.post("/api/models/tiny/release/", json={"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]})
    assert wait_until(lambda: acked(api, 2, 2), 5)
    doomed.kill()

    started = time.monotonic()
    drill = api.post("/api/models/tiny/drills/").json()

    assert time.monotonic() - started < 15
    assert drill["status"] == "failed"
    rows = {row["worker"]: row for row in drill["workers"]}
    assert rows["worker-0"]["ok"] is True
    assert rows["worker-1"]["ack_s"] is None
    assert "no ack" in rows["worker-1"]["error"]
    assert drill["last_ack_s"] is None


def test_worker_started_after_a_change_catches_up(stack, api):
    api.post("/api/models/tiny/release/", json={"routes": [{"version": 2, "weight": 100}]})

    worker = stack.start_worker()

    assert routes_of(worker) == [{"version": 2, "weight": 100}]
    assert predict(worker).json()["model_version"] == 2
    assert wait_until(lambda: acked(api, 2, 1), 5)


def test_artifact_with_a_wrong_sha256_is_refused_and_reported(stack, api):
    worker = stack.start_worker()
    version_two = ModelVersion.objects.get(model__name="tiny", number=2)
    storage.path_for(version_two.sha256).write_bytes(b"tampered bytes")

    # Forced: the console refuses a file whose size it sees changed; the worker's refusal is tested here.
    generation = api.post("/api/models/tiny/release/", json={"routes": [{"version": 2, "weight": 100}], "force": True,
                                                            "reason": "the worker must refuse it"}).json()["release"]["generation"]
    row = wait_until(lambda: next((row for row in api.get("/api/models/tiny/release/").json()["workers"] if not row["ok"]), None), 5)

    assert row is not None
    assert "sha256" in row["error"]
    assert row["generation"] < generation
    assert routes_of(worker) == [{"version": 1, "weight": 100}]
    assert predict(worker).json()["model_version"] == 1


def test_worker_keeps_serving_without_redis_and_catches_up_after(tmp_path, settings, model, operator):
    from console import embedded_redis
    from tools.stack import free_port

    port = free_port()
    redis_process, redis_url = embedded_redis.start(tmp_path / "redis", port=port)
    stack = make_stack(tmp_path, settings, connection.settings_dict, REDIS_URL=redis_url)
    try:
        stack.start_console()
        worker = stack.start_worker()
        token, _ = Token.objects.get_or_create(user=operator)
        api = httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Token {token.key}"}, timeout=30)
        embedded_redis.stop(redis_process)

        assert [predict(worker).status_code for _ in range(20)] == [200] * 20
        assert api.post("/api/models/tiny/release/", json={"routes": [{"version": 2, "weight": 100}]}).status_code == 201
        redis_process, _ = embedded_redis.start(tmp_path / "redis", port=port)

        assert wait_until(lambda: routes_of(worker) == [{"version": 2, "weight": 100}], 20, 0.2)
        assert predict(worker).json()["model_version"] == 2
    finally:
        stack.stop()
        embedded_redis.stop(redis_process)
