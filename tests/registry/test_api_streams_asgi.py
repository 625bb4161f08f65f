"""Downloads through the console's ASGI application, as uvicorn serves it: an artifact
leaves a part at a time, so a download holds about a megabyte of the console's memory
whatever the artifact's size, and the audit CSV reads its rows from the database as it goes."""

from __future__ import annotations

import asyncio
import csv
import hashlib
import io
import os
import tracemalloc

import pytest
from rest_framework.authtoken.models import Token

from registry.artifacts import storage
from registry.domain.audit_log import CSV_HEADER
from registry.models import AuditEvent, ModelVersion, RegisteredModel

pytestmark = pytest.mark.django_db(transaction=True)  # the ASGI handler reads the database from its own thread

ARTIFACT_BYTES = 24 * 1024 * 1024


class Download:
    def __init__(self) -> None:
        self.status, self.headers = None, {}
        self.sha256, self.size, self.parts = hashlib.sha256(), 0, 0
        self.body = io.BytesIO()


def get(path: str, headers: list[tuple[bytes, bytes]], keep_body: bool = False) -> tuple[Download, int]:
    """GET `path` through console.asgi.application; the download and the peak of traced
    Python memory while it ran (the body is hashed and dropped part by part, not kept)."""
    from console.asgi import application

    download = Download()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), *headers], "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}

    requested = []

    async def receive():
        if not requested:
            requested.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays connected until the answer ends

    async def send(message):
        if message["type"] == "http.response.start":
            download.status = message["status"]
            download.headers = {name.lower(): value for name, value in message["headers"]}
        elif message["type"] == "http.response.body" and message.get("body"):
            download.sha256.update(message["body"])
            download.size += len(message["body"])
            download.parts += 1
            if keep_body:
                download.body.write(message["body"])

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        asyncio.run(application(scope, receive, send))
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    return download, peak


@pytest.fixture
def big_version(db) -> ModelVersion:
    content = os.urandom(ARTIFACT_BYTES)  # the view sends bytes; what they are does not matter here
    sha256 = hashlib.sha256(content).hexdigest()
    path = storage.path_for(sha256)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    model = RegisteredModel.objects.create(name="big")
    return ModelVersion.objects.create(model=model, number=1, sha256=sha256, size_bytes=len(content), status="ready")


def test_an_artifact_download_holds_about_a_megabyte_whatever_its_size(settings, big_version):
    headers = [(b"authorization", f"Bearer {settings.SERVING_WORKER_TOKEN}".encode())]
    get("/api/models/big/versions/1/artifact", headers)  # the first request also imports and sets up

    download, peak = get("/api/models/big/versions/1/artifact", headers)

    assert download.status == 200
    assert download.size == ARTIFACT_BYTES and download.sha256.hexdigest() == big_version.sha256
    assert download.headers[b"content-length"] == str(ARTIFACT_BYTES).encode()
    assert download.headers[b"x-artifact-sha256"] == big_version.sha256.encode()
    assert peak < 4 * 1024 * 1024, f"{peak / 2**20:.1f} MiB held while sending {ARTIFACT_BYTES / 2**20:.0f} MiB"


def test_the_audit_csv_streams_its_rows_through_the_asgi_handler(operator, three_versions):
    token = Token.objects.get_or_create(user=operator)[0].key

    download, _ = get("/api/models/digits/audit/", [(b"authorization", f"Token {token}".encode()), (b"accept", b"text/csv")],
                      keep_body=True)

    assert download.status == 200
    rows = list(csv.reader(io.StringIO(download.body.getvalue().decode())))
    assert rows[0] == CSV_HEADER
    assert sorted(row[1] for row in rows[1:]) == sorted(AuditEvent.objects.filter(model=three_versions).values_list("kind", flat=True))
    assert [row[1] for row in rows[1:]].count("version_uploaded") == 3
