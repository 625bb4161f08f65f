"""One model's broken canary holds no other model's rollback, with a live console and a
real worker process: the rollback serves, the broken model keeps what it served, and the
console shows the worker failing with its reason, never converged."""

from __future__ import annotations

import collections
import os

import httpx
import pytest
from django.db import connection

from registry.artifacts import storage
from registry.models import ModelVersion, RegisteredModel
from tests.integration.conftest import registered
from tools.stack import running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROW = [0.5] * 16

# Forced: the console refuses to route a file whose size it sees changed; what these tests
# are about is the worker's own refusal of it.
BROKEN_CANARY = {"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], "force": True, "reason": "the workers must refuse it"}


@pytest.fixture
def other(operator) -> RegisteredModel:
    """``other``, beside the conftest's ``tiny``, with versions 1 (stable) and 2."""
    return registered("other", (3, 4), operator)


@pytest.fixture
def stack(tmp_path, settings, model, other):
    with running_stack(tmp_path, settings, connection.settings_dict) as stack:
        yield stack


def served(worker, model: str, count: int = 20) -> collections.Counter:
    with httpx.Client(base_url=worker.url, timeout=10) as client:
        return collections.Counter(client.post("/predict", json={"model_name": model, "inputs": [ROW]}).json()["model_version"]
                                   for _ in range(count))


def worker_row(api) -> dict:
    return api.get("/api/workers/").json()[0]


def test_a_rollback_serves_while_another_model_s_canary_cannot_load(stack, api):
    assert api.post("/api/models/other/release/", json={"routes": [{"version": 2, "weight": 100}]}).status_code == 201
    worker = stack.start_worker()
    assert served(worker, "other") == {2: 20}
    canary = storage.path_for(ModelVersion.objects.get(model__name="tiny", number=2).sha256)
    os.chmod(canary, 0o600)
    canary.write_bytes(b"not the artifact the console registered")  # the worker's sha256 check fails it
    assert api.post("/api/models/tiny/release/", json=BROKEN_CANARY).status_code == 201

    rollback = api.post("/api/models/other/release/rollback/")

    assert rollback.status_code == 201
    assert wait_until(lambda: served(worker, "other") == {1: 20}, 15), served(worker, "other")
    assert served(worker, "tiny") == {1: 20}
    assert wait_until(lambda: "applied but for tiny (keeps the routes it served before)" in (worker_row(api)["error"] or ""), 10), worker_row(api)
    row = worker_row(api)
    assert row["converged"] is False and row["ok"] is False
    assert "tiny v2" in row["error"]
    assert row["state"].startswith("applied but for tiny (keeps the routes it served before): tiny v2:")  # not "failed to apply: applied …"


def test_a_worker_started_while_a_canary_cannot_load_serves_the_stable(stack, api):
    """Started by an autoscaler during a broken canary, it reported ready and answered 503
    to every request of that model, though the stable, 90% of the split, loaded fine."""
    canary = storage.path_for(ModelVersion.objects.get(model__name="tiny", number=2).sha256)
    os.chmod(canary, 0o600)
    canary.write_bytes(b"not the artifact the console registered")
    assert api.post("/api/models/tiny/release/", json=BROKEN_CANARY).status_code == 201

    worker = stack.start_worker()

    assert served(worker, "tiny") == {1: 20}
    # Its first apply serves v1 alone; each retry keeps that ("keeps the routes it served before").
    assert wait_until(lambda: "applied but for tiny (" in (worker_row(api)["error"] or ""), 10), worker_row(api)
    assert worker_row(api)["converged"] is False
    # The worker's own check at the first download; the console's 503 once a whole download showed its copy changed.
    error = worker_row(api)["error"]
    assert "tiny v2: sha256 mismatch" in error or "tiny v2: cannot download" in error and "does not match its sha256" in error, error


def test_a_drill_of_one_model_passes_while_another_model_s_canary_cannot_load(stack, api):
    """The console proved a worker's whole state, so this drill failed on a worker that served
    the rollback at once: a broken canary of another model made every drill there fail."""
    assert api.post("/api/models/other/release/", json={"routes": [{"version": 2, "weight": 100}]}).status_code == 201
    worker = stack.start_worker()
    assert served(worker, "other") == {2: 20}
    canary = storage.path_for(ModelVersion.objects.get(model__name="tiny", number=2).sha256)
    os.chmod(canary, 0o600)
    canary.write_bytes(b"not the artifact the console registered")
    assert api.post("/api/models/tiny/release/", json=BROKEN_CANARY).status_code == 201
    assert wait_until(lambda: "applied but for tiny (" in (worker_row(api)["error"] or ""), 10), worker_row(api)

    drill = api.post("/api/models/other/drills/", json={"roll_forward": True}).json()

    assert drill["status"] == "passed", drill
    row = drill["workers"][0]
    assert row["confirmed_s"] is not None and row["ok"] is False
    assert row["note"].startswith("applied but for tiny (keeps the routes it served before): tiny v2:")
    assert "1 worker(s) serve the rollback of other, proved by its digest, but not the whole state" in drill["error"]
    assert drill["forward_generation"] is not None
    assert wait_until(lambda: served(worker, "other") == {2: 20}, 10)  # rolled forward
    assert wait_until(lambda: api.get("/api/models/other/release/").json()["converged"], 10)
    assert api.get("/api/models/tiny/release/").json()["converged"] is False
