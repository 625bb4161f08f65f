"""Workers' reports and acks as the console receives them, and what the API shows."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from registry.models import WorkerAck

pytestmark = pytest.mark.django_db


@pytest.fixture
def worker_client(settings) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {settings.SERVING_WORKER_TOKEN}")
    return client


def report(generation=1, **extra):
    return {
        "worker": {"id": "w-1", "host": "box", "pid": 7, "url": "http://127.0.0.1:9", "device": "cpu"},
        "generation": generation,
        "loaded": [{"model": "digits", "version": 1, "routed": True, "ready": True}],
        "versions": [{"model": "digits", "version": 1, "requests": 5, "errors": 0, "latency_sum_s": 0.01,
                      "latency_buckets": {"0.001": 5, "+Inf": 5}, "batch_size_buckets": {"1": 5, "+Inf": 5}}],
        **extra,
    }


def test_reported_worker_is_listed_with_its_generation_and_last_report(worker_client, viewer_client):
    assert worker_client.post("/api/serving/reports", report(generation=3), format="json").status_code == 204

    workers = viewer_client.get("/api/workers/").json()

    assert [(row["worker_id"], row["generation"], row["device"]) for row in workers] == [("w-1", 3, "cpu")]
    assert workers[0]["last_report"]["versions"][0]["requests"] == 5


def test_report_without_identity_is_refused(worker_client):
    response = worker_client.post("/api/serving/reports", {"generation": 1}, format="json")

    assert response.status_code == 400
    assert response.json()["error"].startswith("worker:")


@pytest.mark.parametrize(
    ("change", "field"),
    [({"loaded": "everything"}, "loaded"), ({"loaded": [{"model": "digits"}]}, "version"), ({"versions": [3]}, "versions"),
     ({"generation": "new"}, "generation")],
)
def test_malformed_report_is_refused_and_nothing_recorded(worker_client, viewer_client, change, field):
    response = worker_client.post("/api/serving/reports", report(**change), format="json")

    assert response.status_code == 400
    assert field in response.content.decode()
    assert viewer_client.get("/api/workers/").json() == []


def test_reports_and_acks_need_the_worker_token(operator_client):
    assert operator_client.post("/api/serving/reports", report(), format="json").status_code == 401
    assert operator_client.post("/api/serving/acks", {"worker": "w", "generation": 1, "ok": True}, format="json").status_code == 401


def test_a_repeated_ack_is_stored_once(worker_client):
    body = {"worker": "w-1", "generation": 2, "ok": True, "load_ms": 12.5}

    worker_client.post("/api/serving/acks", body, format="json")
    worker_client.post("/api/serving/acks", body, format="json")

    assert WorkerAck.objects.filter(worker_id="w-1", generation=2).count() == 1


def test_failed_ack_marks_the_worker_not_converged(worker_client, operator_client, three_versions):
    worker_client.post("/api/serving/reports", report(generation=1), format="json")
    operator_client.post("/api/models/digits/release/", {"routes": [{"version": 2, "weight": 100}]}, format="json")

    worker_client.post("/api/serving/acks", {"worker": "w-1", "generation": 2, "ok": False, "error": "sha256 mismatch"}, format="json")

    body = operator_client.get("/api/models/digits/release/").json()
    assert body["converged"] is False
    assert body["workers"][0] | {"last_seen_at": None} == {
        "worker_id": "w-1", "generation": 1, "converged": False, "ok": False, "error": "sha256 mismatch", "rollback_warm": True, "last_seen_at": None,
    }


def test_version_metric_history_lists_the_per_minute_rollups(worker_client, operator_client, three_versions):
    worker_client.post("/api/serving/reports", report(), format="json")
    worker_client.post("/api/serving/reports", report(), format="json")

    history = operator_client.get("/api/models/digits/versions/1/metrics/").json()

    assert len(history) == 1
    assert (history[0]["requests"], history[0]["latency_buckets"]) == (10, {"0.001": 10, "+Inf": 10})


def test_an_ack_before_the_first_report_still_shows_the_worker_failing(worker_client, operator_client, three_versions):
    worker_client.post("/api/serving/acks", {"worker": "w-1", "generation": 2, "ok": False, "error": "sha256 mismatch"}, format="json")
    worker_client.post("/api/serving/reports", report(generation=1), format="json")

    rows = operator_client.get("/api/models/digits/release/").json()["workers"]

    assert [(row["worker_id"], row["ok"], row["error"]) for row in rows] == [("w-1", False, "sha256 mismatch")]
