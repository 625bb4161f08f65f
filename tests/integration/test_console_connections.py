"""What a console process holds of the database while it answers: each running request
is a thread and a connection (console/request_slots.py bounds how many run); a streamed
file needs neither once its first byte is ready, and a flood of calls that are not the
workers' cannot crowd out the workers' own."""

from __future__ import annotations

import io
import socket
import threading
import time

import httpx
import pytest
from django.db import connection

from registry.actions import uploads
from registry.building.onnx_build import random_mlp, to_bytes
from registry.domain.choices import AuditKind, VersionStatus
from registry.models import AuditEvent, RegisteredModel
from tests.fixtures.postgres_only import other_connections, require_postgresql
from tools.stack import running_stack

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(tmp_path, settings, model):
    with running_stack(tmp_path, settings, connection.settings_dict, CONSOLE_MAX_REQUESTS="2", CONSOLE_REQUEST_WAIT_S="1") as stack:
        yield stack


def _slow_reader(console: httpx.URL, path: str, authorization: str) -> socket.socket:
    """A client that takes an answer's head and a few bytes, then reads nothing more."""
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect((console.host, console.port))
    reader.sendall(f"GET {path} HTTP/1.1\r\nHost: {console.host}\r\nAuthorization: {authorization}\r\n\r\n".encode())
    assert reader.recv(12).startswith(b"HTTP/1.1 200")
    return reader


def test_slow_readers_of_large_answers_hold_no_database_connection(stack, api, operator):
    require_postgresql("counts connections in pg_stat_activity")
    big = RegisteredModel.objects.create(name="big")
    version = uploads.register_stream(big, io.BytesIO(to_bytes(random_mlp([2048, 2048, 8], seed=3))), uploaded_by=operator)
    version.status = VersionStatus.READY
    version.save(update_fields=["status"])
    AuditEvent.objects.bulk_create(AuditEvent(model=big, kind=AuditKind.MODEL_CHANGED, message="m" * 400) for _ in range(15_000))
    console = httpx.URL(stack.console.url)
    readers = []
    try:
        for _ in range(3):  # a streamed file, and a large JSON answer (about 7 MB)
            readers.append(_slow_reader(console, f"/api/models/big/versions/{version.number}/artifact", api.headers["Authorization"]))
            readers.append(_slow_reader(console, "/api/models/big/audit/", api.headers["Authorization"]))
        time.sleep(1.0)
        held = other_connections()
        answered = api.get("/api/models/")  # the reads' slots are free too
    finally:
        for reader in readers:
            reader.close()

    assert held <= 1, held  # 6 before: Django closed each request's connection after its last byte
    assert answered.status_code == 200


def test_a_flood_of_calls_without_the_worker_token_does_not_hold_up_the_workers(stack, settings):
    stop = threading.Event()
    flooded: list[int] = []

    def flood() -> None:
        with httpx.Client(base_url=stack.console.url, headers={"Authorization": "Bearer not-the-token"}, timeout=30) as client:
            while not stop.is_set():
                flooded.append(client.post("/api/serving/reports", json={}).status_code)

    floods = [threading.Thread(target=flood) for _ in range(30)]
    for thread in floods:
        thread.start()
    worker_answers = []
    try:
        with httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Bearer {settings.SERVING_WORKER_TOKEN}"},
                          timeout=30) as worker:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                worker_answers.append(worker.get("/api/serving/state").status_code)
                time.sleep(0.1)
    finally:
        stop.set()
        for thread in floods:
            thread.join(timeout=30)

    assert len(flooded) > 30 and set(flooded) <= {401, 503}, set(flooded)
    assert worker_answers and set(worker_answers) == {200}, worker_answers  # 503 "busy" when the flood took the workers' slots
