"""A console run under a file size limit (``ulimit -f``, systemd's ``LimitFSIZE=``, a
container's): an upload past it is a 507 saying why, not a bare 500. Python ignores
SIGXFSZ, so the write raises EFBIG; the request body's spool (``TMPDIR``) meets it first.
A real console under ``prlimit --fsize`` (a 4 MB body, a 3 MB limit): before the fix
uvicorn answered "Internal Server Error" in plain text, the cause only in the log."""

from __future__ import annotations

import os

import httpx
import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from registry.models import ModelVersion
from tools.stack import make_stack

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LIMIT_BYTES = 3_000_000


def test_an_upload_past_the_console_s_file_size_limit_is_a_507_naming_the_limit_and_the_next_small_one_goes_through(
        tmp_path, settings, model, operator):
    stack = make_stack(tmp_path, settings, connection.settings_dict, command_prefix=["prlimit", f"--fsize={LIMIT_BYTES}", "--"])
    stack.start_console()
    try:
        token, _ = Token.objects.get_or_create(user=operator)
        with httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Token {token.key}"}, timeout=60) as api:
            versions = ModelVersion.objects.count()
            response = api.post("/api/models/tiny/versions/", files={"artifact": ("big.onnx", os.urandom(LIMIT_BYTES + 1_000_000))})

            assert response.status_code == 507, response.text[:300]
            error = response.json()["error"]
            assert "cannot keep a file this large: file too large" in error, error
            assert f"may write files of up to {LIMIT_BYTES} bytes (ulimit -f)" in error, error
            assert "retry-after" not in response.headers
            assert ModelVersion.objects.count() == versions
            # The console goes on: a small upload is read and judged (not a model: a 400 saying so).
            small = api.post("/api/models/tiny/versions/", files={"artifact": ("small.onnx", b"not a model")})
            assert small.status_code == 400, small.text[:300]
    finally:
        stack.stop()
    assert "Traceback" not in stack.console.log()


def test_a_change_whose_sqlite_file_cannot_grow_past_the_file_size_limit_is_a_507_naming_the_limit_not_a_retry(tmp_path, settings):
    """SQLite names no errno: EFBIG on its file or journal is SQLITE_IOERR_WRITE ("disk I/O
    error"), which read as an outage: every change a 503 "retry in 5 s" for good, while
    /readyz said the database was ok (60 of 60 before the fix). The console runs on a SQLite
    database of its own, whatever the suite's database is (CI's is PostgreSQL)."""
    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "own.sqlite3")}
    unlimited = make_stack(tmp_path, settings, database)
    unlimited.manage("migrate", "--noinput")
    token = unlimited.operator_token()
    limit = os.path.getsize(database["NAME"]) + 8192
    stack = make_stack(tmp_path, settings, database, command_prefix=["prlimit", f"--fsize={limit}", "--"])
    stack.start_console()
    try:
        with httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Token {token}"}, timeout=60) as api:
            answers = [api.post("/api/models/", json={"name": f"m{number}", "description": "x" * 1900}) for number in range(20)]
            refused = [answer for answer in answers if answer.status_code != 201]

            assert refused, "the limit was never reached"
            assert {answer.status_code for answer in refused} == {507}, [(answer.status_code, answer.text[:200]) for answer in refused]
            assert not [answer for answer in refused if "retry-after" in answer.headers]
            assert f"under a file size limit of {limit} bytes" in refused[0].json()["error"]
            assert api.get("/api/models/").status_code == 200  # reads go on
    finally:
        stack.stop()
