"""Every worker holds the same token: what stops one holder from speaking in another
worker's name is the key each worker sends with its reports and acks
(registry/fleet/worker_keys.py). A live console and a real worker process; the forger
holds the token, as an audit did when it made a drill pass for a frozen worker."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from django.db import connection

from registry.fleet.state import issued_digest
from registry.models import Worker, WorkerAck
from serving.contract import CONTRACT_VERSION, WORKER_KEY_HEADER
from tools.stack import running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(tmp_path, settings, model):
    with running_stack(tmp_path, settings, connection.settings_dict) as stack:
        yield stack


def forged_ack(stack, settings, worker_id: str, key: str | None) -> httpx.Response:
    generation = Worker.objects.get(worker_id=worker_id).generation
    headers = {"Authorization": f"Bearer {settings.SERVING_WORKER_TOKEN}", **({WORKER_KEY_HEADER: key} if key else {})}
    body = {"worker": worker_id, "generation": generation, "digest": issued_digest(generation), "ok": True, "contract": CONTRACT_VERSION}
    return httpx.post(f"{stack.console.url}/api/serving/acks", json=body, headers=headers, timeout=10)


def test_an_ack_in_a_frozen_workers_name_is_refused_and_its_own_key_stays_its(stack, settings):
    worker = stack.start_worker()
    assert wait_until(lambda: Worker.objects.filter(worker_id="worker-0").exclude(key_digest="").exists(), 15)
    os.kill(worker.popen.pid, signal.SIGSTOP)  # frozen: it holds its port and says nothing
    try:
        time.sleep(0.5)  # an ack it sent just before is stored by now; it sends no other
        before = list(WorkerAck.objects.values_list("worker_id", "generation", "ok", "received_at"))
        for key in (None, "a-key-of-the-forgers-own"):
            answer = forged_ack(stack, settings, "worker-0", key)
            assert answer.status_code == 403
            assert "belongs to the worker process that first reported under it" in answer.json()["error"]
        assert list(WorkerAck.objects.values_list("worker_id", "generation", "ok", "received_at")) == before
    finally:
        os.kill(worker.popen.pid, signal.SIGCONT)
    seen = Worker.objects.get(worker_id="worker-0").last_seen_at
    assert wait_until(lambda: Worker.objects.get(worker_id="worker-0").last_seen_at > seen, 10)  # its own reports go on
