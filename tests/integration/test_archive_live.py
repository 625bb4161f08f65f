"""Archiving a served model end to end: a real worker unloads it once it acks the
archive release, and serves the same routes again once it acks the restore."""

from __future__ import annotations

import httpx
import pytest
from django.db import connection

from tools.stack import running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ACK_TIMEOUT_S = 10


@pytest.fixture
def stack(tmp_path, settings, model):
    with running_stack(tmp_path, settings, connection.settings_dict) as stack:
        yield stack


def acked(api, generation: int) -> bool:
    rows = api.get("/api/models/tiny/release/").json()["workers"]
    return len(rows) == 1 and rows[0]["generation"] >= generation and rows[0]["ok"] and rows[0]["converged"]


def test_a_worker_unloads_an_archived_model_and_serves_it_again_after_restore(stack, api):
    worker = stack.start_worker()
    split = [{"version": 1, "weight": 70}, {"version": 2, "weight": 30}]
    generation = api.post("/api/models/tiny/release/", json={"routes": split}).json()["release"]["generation"]
    assert wait_until(lambda: acked(api, generation), ACK_TIMEOUT_S)

    archived = api.post("/api/models/tiny/archive/", json={"reason": "retired"}).json()["current_release"]
    assert wait_until(lambda: acked(api, archived["generation"]), ACK_TIMEOUT_S), api.get("/api/models/tiny/release/").json()
    gone = httpx.get(worker.url + "/v2/models/tiny", timeout=5)

    restored = api.post("/api/models/tiny/unarchive/", json={}).json()["current_release"]
    assert wait_until(lambda: acked(api, restored["generation"]), ACK_TIMEOUT_S), api.get("/api/models/tiny/release/").json()
    back = httpx.get(worker.url + "/v2/models/tiny", timeout=5)

    assert (archived["action"], gone.status_code) == ("archive", 404)
    assert (restored["action"], back.status_code, back.json()["parameters"]["routes"]) == ("restore", 200, split)
