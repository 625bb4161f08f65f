"""A request body that fills the console's temporary space is a 507 naming it.

Django spools a body larger than ``FILE_UPLOAD_MAX_MEMORY_SIZE`` to a file in ``TMPDIR``
before any view runs. When that file system is full, the answer used to be uvicorn's
plain-text 500 with a traceback in the log. The test runs the console's ASGI
application in a process of its own, inside a mount namespace, whose ``TMPDIR`` is a
real tmpfs far smaller than the upload.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.mount_namespace import in_a_mount_namespace

REPOSITORY = Path(__file__).resolve().parents[2]
TMPFS_BYTES = 64 * 1024

# Set up a console on a fresh SQLite database, then mount the small tmpfs over TMPDIR
# (after the migrations, which may want temporary space of their own) and send an
# operator's 3 MB upload through console.asgi.application, as uvicorn would.
CONSOLE_WITH_A_SMALL_TMPDIR = """
import asyncio, json, os, shutil, subprocess, sys, tempfile
import django
django.setup()
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from rest_framework.authtoken.models import Token
from registry.models import ModelVersion, RegisteredModel
call_command("migrate", verbosity=0)
operator = User.objects.create_user("olivia")
operator.groups.add(Group.objects.get_or_create(name="operator")[0])
RegisteredModel.objects.create(name="digits", created_by=operator)
token = Token.objects.create(user=operator).key
tmpdir = tempfile.gettempdir()
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % sys.argv[1], "tmpfs", tmpdir], check=True)
from console.asgi import application

def request(method, path, body, headers):
    answer = {"status": None, "body": b""}
    chunks = [body[start:start + 256 * 1024] for start in range(0, len(body), 256 * 1024)] or [b""]
    sent = []

    async def receive():
        if len(sent) < len(chunks):
            sent.append(True)
            return {"type": "http.request", "body": chunks[len(sent) - 1], "more_body": len(sent) < len(chunks)}
        await asyncio.Event().wait()

    async def send(message):
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"authorization", ("Token " + token).encode()),
                         (b"content-length", str(len(body)).encode()), *headers],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
    asyncio.run(asyncio.wait_for(application(scope, receive, send), 60))
    return answer

body = b"--b\\r\\nContent-Disposition: form-data; name=\\"artifact\\"; filename=\\"m.onnx\\"\\r\\n\\r\\n" + os.urandom(3 * 1024 * 1024) + b"\\r\\n--b--\\r\\n"
upload = request("POST", "/api/models/digits/versions/", body, [(b"content-type", b"multipart/form-data; boundary=b")])
later = request("GET", "/api/models/digits/versions/", b"", [])
print(json.dumps({"status": upload["status"], "body": upload["body"].decode(errors="replace"), "tmpdir": tmpdir,
                  "tmpdir_used": shutil.disk_usage(tmpdir).used, "tmpdir_files": os.listdir(tmpdir),
                  "versions": ModelVersion.objects.count(), "later": later["status"]}))
"""


def test_an_upload_larger_than_the_free_temporary_space_is_507_naming_it_and_keeps_nothing(tmp_path):
    prefix = in_a_mount_namespace()
    tmpdir, data = tmp_path / "tmp", tmp_path / "data"
    tmpdir.mkdir()
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL"}}
    environment.update(DATA_DIR=str(data), ARTIFACT_ROOT=str(tmp_path / "store"), TMPDIR=str(tmpdir),
                       DJANGO_SETTINGS_MODULE="console.settings", PYTHONPATH=str(REPOSITORY))

    finished = subprocess.run([*prefix, sys.executable, "-c", CONSOLE_WITH_A_SMALL_TMPDIR, str(TMPFS_BYTES)],
                              cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=180)

    assert finished.returncode == 0, finished.stderr[-3000:]
    answer = json.loads(finished.stdout.strip().splitlines()[-1])
    assert answer["status"] == 507, answer["body"]
    error = json.loads(answer["body"])["error"]
    assert error.startswith(f"the console's temporary space for request bodies ({tmpdir}, TMPDIR) is full: no space left on device (")
    assert "nothing was kept" in error
    assert (answer["tmpdir_used"], answer["tmpdir_files"], answer["versions"], answer["later"]) == (0, [], 0, 200)
