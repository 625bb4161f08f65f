"""A full disk under an upload (a model, a batch job's input, a data set) is a 507 that
names the problem; the staged file is removed, nothing is recorded, and the console takes
the next upload once there is room.

Most tests fill the disk at the storage layer: the staging file writes what fits in
``ROOM_BYTES``, then fails with ENOSPC (or EDQUOT) as a full file system does, and its
close fails too (the buffered rest cannot be written either). One test fills a real
tmpfs, mounted in a mount namespace of its own (``unshare``): it runs where namespaces
can be made (here, and in CI, which runs as root) and is skipped where none can.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.artifacts import storage
from registry.building.onnx_build import random_mlp
from registry.models import EvaluationDataset, Job, ModelVersion, RegisteredModel
from tests.fixtures.job_world import CLASSES, npy_upload, npz_upload, rows
from tests.fixtures.mount_namespace import in_a_mount_namespace
from tests.fixtures.onnx_files import write_model
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db

ROOM_BYTES = 1000
REPOSITORY = Path(__file__).resolve().parents[2]


class FillingFile:
    """A staging file on a disk with ``ROOM_BYTES`` left."""

    def __init__(self, real, error_number: int):
        self.real = real
        self.error_number = error_number
        self.full = False

    def write(self, chunk: bytes) -> int:
        room = ROOM_BYTES - self.real.tell()
        if len(chunk) <= room:
            return self.real.write(chunk)
        self.real.write(chunk[:max(room, 0)])
        self.real.flush()  # what fitted is on disk: a half-written file to clean up
        self.full = True
        raise OSError(self.error_number, os.strerror(self.error_number))

    def close(self) -> None:
        closing = not self.real.closed
        self.real.close()
        if closing and self.full:
            raise OSError(self.error_number, os.strerror(self.error_number))


@pytest.fixture
def fill_disk(monkeypatch):
    """Call it to fill the disk (ENOSPC unless told another errno); ``monkeypatch.undo()``
    frees it."""

    def fill(error_number: int = errno.ENOSPC) -> None:
        original = storage.StagingWriter.__init__

        def on_a_full_disk(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self._file = FillingFile(self._file, error_number)

        monkeypatch.setattr(storage.StagingWriter, "__init__", on_a_full_disk)

    return fill


@pytest.fixture
def model(operator) -> RegisteredModel:
    return RegisteredModel.objects.create(name="digits", created_by=operator)


@pytest.fixture
def operator_page(operator):
    """The console's pages, signed in as an operator."""
    from tests.console.conftest import signed_in

    return signed_in(operator)


def upload(client, path: Path):
    with open(path, "rb") as handle:
        return client.post("/api/models/digits/versions/", {"artifact": handle}, format="multipart")


def staged_files(artifact_root: Path) -> list[Path]:
    return [path for path in stored_files(artifact_root) if path.relative_to(artifact_root).parts[0] == "tmp"]


@pytest.mark.parametrize(("error_number", "problem"), [(errno.ENOSPC, "no space left on device"), (errno.EDQUOT, "disk quota exceeded")])
def test_a_model_upload_on_a_full_disk_is_507_naming_the_problem_and_keeps_nothing(
        model, operator_client, good_onnx, artifact_root, fill_disk, error_number, problem):
    fill_disk(error_number)

    response = upload(operator_client, good_onnx)

    assert response.status_code == 507
    error = response.json()["error"]
    assert error.startswith(f"the artifact store is full: {problem} (")
    assert error.endswith(" bytes free in ARTIFACT_ROOT); nothing was kept: send it again once space is freed")
    assert stored_files(artifact_root) == []
    assert (ModelVersion.objects.count(), Job.objects.count()) == (0, 0)


def test_a_model_upload_past_the_largest_file_the_store_may_hold_is_507_naming_it_and_keeps_nothing(
        model, operator_client, good_onnx, artifact_root, fill_disk):
    """EFBIG (a file size limit, or a file system's largest file) was a bare 500."""
    fill_disk(errno.EFBIG)

    response = upload(operator_client, good_onnx)

    assert response.status_code == 507
    assert "retry-after" not in response.headers  # no retry mends it
    error = response.json()["error"]
    assert error.startswith("the artifact store cannot keep a file this large: file too large ("), error
    assert error.endswith("); nothing was kept")
    assert stored_files(artifact_root) == []
    assert (ModelVersion.objects.count(), Job.objects.count()) == (0, 0)


def test_the_console_takes_the_next_upload_once_there_is_room(model, operator_client, good_onnx, artifact_root, fill_disk, monkeypatch):
    fill_disk()
    assert upload(operator_client, good_onnx).status_code == 507
    monkeypatch.undo()  # space freed

    response = upload(operator_client, good_onnx)

    assert response.status_code == 202, response.json()
    assert response.json()["number"] == 1
    assert storage.exists(response.json()["sha256"])
    assert staged_files(artifact_root) == []


def test_a_full_disk_is_logged_once_as_an_error_naming_the_request(model, operator_client, good_onnx, fill_disk, caplog):
    fill_disk()

    with caplog.at_level(logging.ERROR):
        upload(operator_client, good_onnx)

    # Beside Django's own line for any 5xx ("Insufficient Storage: <path>"), which names no cause.
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR and record.name.startswith("registry")]
    assert errors == ["the artifact store could not keep a file on POST /api/models/digits/versions/: [Errno 28] No space left on device"]


def test_a_batch_job_input_on_a_full_disk_is_507_and_queues_nothing(jobs_model, operator_client, artifact_root, fill_disk):
    jobs_before = Job.objects.count()
    fill_disk()

    response = operator_client.post("/api/models/digits/jobs/", {"input": npy_upload(rows(100))}, format="multipart")

    assert response.status_code == 507
    assert response.json()["error"].startswith("the artifact store is full: no space left on device (")
    assert Job.objects.count() == jobs_before
    assert [path for path in stored_files(artifact_root) if path.relative_to(artifact_root).parts[0] != "sha256"] == []


def test_a_data_set_on_a_full_disk_is_507_and_adds_nothing(jobs_model, operator_client, artifact_root, fill_disk):
    jobs_before = Job.objects.count()
    fill_disk()
    upload_file = npz_upload("holdout.npz", input=rows(50), labels=[index % CLASSES for index in range(50)])

    response = operator_client.post("/api/models/digits/datasets/", {"file": upload_file, "name": "holdout", "task": "classification"},
                                    format="multipart")

    assert response.status_code == 507
    assert response.json()["error"].startswith("the artifact store is full: no space left on device (")
    assert (EvaluationDataset.objects.count(), Job.objects.count()) == (0, jobs_before)
    assert [path for path in stored_files(artifact_root) if path.relative_to(artifact_root).parts[0] != "sha256"] == []


def test_an_upload_through_the_model_page_on_a_full_disk_is_507_naming_the_problem(model, operator_page, good_onnx, artifact_root,
                                                                                 fill_disk):
    fill_disk()

    with open(good_onnx, "rb") as handle:
        response = operator_page.post("/models/digits/upload/", {"artifact": handle}, HTTP_ACCEPT="application/json")

    assert response.status_code == 507  # the page showed "HTTP 500 Something went wrong"
    assert response.json()["message"].startswith("Upload refused: the artifact store is full: no space left on device (")
    assert stored_files(artifact_root) == [] and ModelVersion.objects.count() == 0


def test_a_batch_job_through_the_jobs_page_on_a_full_disk_is_507(jobs_model, operator_page, artifact_root, fill_disk):
    jobs_before = Job.objects.count()
    fill_disk()

    response = operator_page.post("/models/digits/jobs/new", {"input": npy_upload(rows(100))}, HTTP_ACCEPT="application/json")

    assert response.status_code == 507
    assert response.json()["message"].startswith("the artifact store is full: no space left on device (")
    assert Job.objects.count() == jobs_before


# ---------------------------------------------------------------- a store that refuses writes

REFUSED = "the artifact store refused the write: "
MENDED = ("; nothing was kept. ARTIFACT_ROOT must be mounted read-write and writable by the console's user; "
          "send it again once it is")


@pytest.mark.parametrize(("error_number", "problem"), [(errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied"),
                                                       (errno.EPERM, "operation not permitted")])
def test_a_model_upload_to_a_store_that_refuses_writes_is_503_naming_the_problem_and_keeps_nothing(
        model, operator_client, good_onnx, artifact_root, fill_disk, error_number, problem):
    fill_disk(error_number)

    response = upload(operator_client, good_onnx)

    assert response.status_code == 503  # was a 500 "internal error", naming nothing
    assert response.json()["error"] == REFUSED + problem + MENDED
    assert response["Retry-After"] == "30"
    assert stored_files(artifact_root) == [] and ModelVersion.objects.count() == 0


def test_a_batch_job_input_to_a_store_that_refuses_writes_is_503_and_queues_nothing(jobs_model, operator_client, artifact_root, fill_disk):
    jobs_before = Job.objects.count()
    fill_disk(errno.EROFS)

    response = operator_client.post("/api/models/digits/jobs/", {"input": npy_upload(rows(100))}, format="multipart")

    assert (response.status_code, response.json()["error"]) == (503, REFUSED + "read-only file system" + MENDED)
    assert Job.objects.count() == jobs_before


def test_a_data_set_to_a_store_that_refuses_writes_is_503_and_adds_nothing(jobs_model, operator_client, fill_disk):
    fill_disk(errno.EACCES)
    upload_file = npz_upload("holdout.npz", input=rows(50), labels=[index % CLASSES for index in range(50)])

    response = operator_client.post("/api/models/digits/datasets/", {"file": upload_file, "name": "holdout", "task": "classification"},
                                    format="multipart")

    assert (response.status_code, response.json()["error"]) == (503, REFUSED + "permission denied" + MENDED)
    assert EvaluationDataset.objects.count() == 0


def test_an_upload_through_the_model_page_to_a_store_that_refuses_writes_is_503_naming_the_problem(model, operator_page, good_onnx,
                                                                                                 fill_disk):
    fill_disk(errno.EROFS)

    with open(good_onnx, "rb") as handle:
        response = operator_page.post("/models/digits/upload/", {"artifact": handle}, HTTP_ACCEPT="application/json")

    assert (response.status_code, response.json()["message"]) == (503, "Upload refused: " + REFUSED + "read-only file system" + MENDED)


def test_a_batch_job_through_the_jobs_page_to_a_store_that_refuses_writes_is_503(jobs_model, operator_page, fill_disk):
    fill_disk(errno.EPERM)

    response = operator_page.post("/models/digits/jobs/new", {"input": npy_upload(rows(100))}, HTTP_ACCEPT="application/json")

    assert (response.status_code, response.json()["message"]) == (503, REFUSED + "operation not permitted" + MENDED)


# ---------------------------------------------------------------- a real full file system

# Run in a process of its own, inside the mount namespace: a console on a fresh SQLite
# database with a model and an operator whose API client is `client`.
FRESH_CONSOLE = """
import errno, json, os, sys
import django
django.setup()
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from rest_framework.test import APIClient
from registry.models import ModelVersion, RegisteredModel
call_command("migrate", verbosity=0)
operator = User.objects.create_user("olivia")
operator.groups.add(Group.objects.get_or_create(name="operator")[0])
RegisteredModel.objects.create(name="digits", created_by=operator)
client = APIClient()
client.force_authenticate(operator)
"""
# ARTIFACT_ROOT is a tmpfs too small for the model it is sent.
CONSOLE_ON_A_SMALL_DISK = FRESH_CONSOLE + """
with open(sys.argv[1], "rb") as handle:
    response = client.post("/api/models/digits/versions/", {"artifact": handle}, format="multipart")
left = sorted(str(path.relative_to(settings.ARTIFACT_ROOT)) for path in settings.ARTIFACT_ROOT.rglob("*") if path.is_file())
later = client.get("/api/models/digits/versions/")
print(json.dumps({"status": response.status_code, "body": response.json(), "left": left, "versions": ModelVersion.objects.count(),
                  "later": later.status_code}))
"""
TMPFS_BYTES = 64 * 1024


def test_a_model_larger_than_the_free_space_of_a_real_file_system_is_507_and_leaves_nothing(tmp_path):
    prefix = in_a_mount_namespace()
    store, data = tmp_path / "store", tmp_path / "data"
    store.mkdir()
    big = write_model(tmp_path, "big.onnx", random_mlp([256, 128, 10], seed=3))
    assert big.stat().st_size > 2 * TMPFS_BYTES
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL"}}
    environment.update(DATA_DIR=str(data), ARTIFACT_ROOT=str(store), DJANGO_SETTINGS_MODULE="console.settings", PYTHONPATH=str(REPOSITORY))
    shell = f'mount -t tmpfs -o size={TMPFS_BYTES} tmpfs "$0" && exec "$1" -c "$2" "$3"'

    finished = subprocess.run([*prefix, "sh", "-c", shell, str(store), sys.executable, CONSOLE_ON_A_SMALL_DISK, str(big)],
                              cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=180)

    assert finished.returncode == 0, finished.stderr[-3000:]
    answer = json.loads(finished.stdout.strip().splitlines()[-1])
    assert answer["status"] == 507
    assert answer["body"]["error"].startswith("the artifact store is full: no space left on device (")
    assert (answer["left"], answer["versions"], answer["later"]) == ([], 0, 200)


def test_a_model_upload_to_a_real_read_only_store_is_503_and_leaves_nothing(tmp_path, good_onnx):
    prefix = in_a_mount_namespace()
    store, data = tmp_path / "store", tmp_path / "data"
    (store / "tmp").mkdir(parents=True)
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL"}}
    environment.update(DATA_DIR=str(data), ARTIFACT_ROOT=str(store), DJANGO_SETTINGS_MODULE="console.settings", PYTHONPATH=str(REPOSITORY))
    # The store bound onto itself and made read-only, as a volume mounted ro would be.
    shell = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$1" -c "$2" "$3"'

    finished = subprocess.run([*prefix, "sh", "-c", shell, str(store), sys.executable, CONSOLE_ON_A_SMALL_DISK, str(good_onnx)],
                              cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=180)

    assert finished.returncode == 0, finished.stderr[-3000:]
    answer = json.loads(finished.stdout.strip().splitlines()[-1])
    assert (answer["status"], answer["body"]["error"]) == (503, REFUSED + "read-only file system" + MENDED)
    assert (answer["left"], answer["versions"], answer["later"]) == ([], 0, 200)


# A console on a fresh SQLite database in DATA_DIR, a tmpfs then filled to the last byte.
CONSOLE_WITH_ITS_DATABASE_ON_A_FULL_DISK = FRESH_CONSOLE + """
from django.test import Client
page = Client()
page.force_login(operator)
filler_path = os.path.join(os.environ["DATA_DIR"], "filler")
with open(filler_path, "wb", buffering=0) as filler:
    try:
        while True:
            filler.write(bytes(4096))
    except OSError as error:
        assert error.errno == errno.ENOSPC, error
write = client.post("/api/models/", {"name": "fraud", "description": "x" * 2000}, format="json")
read = client.get("/api/models/")
form = page.post("/models/", {"name": "cards", "description": "y" * 2000})
os.remove(filler_path)
after = client.post("/api/models/", {"name": "fraud"}, format="json")
print(json.dumps({"status": write.status_code, "body": write.json(), "retry_after": write.headers.get("Retry-After"),
                  "read": read.status_code, "models": [model["name"] for model in read.json()], "after": after.status_code,
                  "page": [form.status_code, "The database's disk is full" in form.content.decode()]}))
"""


def test_a_change_while_the_database_s_disk_is_full_is_a_507_saying_so_and_the_console_goes_on_once_there_is_room(tmp_path):
    """It was a 503 "the database is unavailable; retry in 5 s", which no retry mends
    (a fault test filled DATA_DIR, 7 Dec)."""
    prefix = in_a_mount_namespace()
    data = tmp_path / "data"
    data.mkdir()
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL"}}
    environment.update(DATA_DIR=str(data), DJANGO_SETTINGS_MODULE="console.settings", PYTHONPATH=str(REPOSITORY))
    shell = 'mount -t tmpfs -o size=8m tmpfs "$0" && exec "$1" -c "$2"'

    finished = subprocess.run([*prefix, "sh", "-c", shell, str(data), sys.executable, CONSOLE_WITH_ITS_DATABASE_ON_A_FULL_DISK],
                              cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=180)

    assert finished.returncode == 0, finished.stderr[-3000:]
    answer = json.loads(finished.stdout.strip().splitlines()[-1])
    assert answer["status"] == 507
    assert answer["body"]["error"] == ("the disk holding the console's database is full: nothing was changed; "
                                       "free space on it and the console goes on by itself")
    assert answer["retry_after"] is None  # waiting alone mends nothing
    assert (answer["read"], answer["models"], answer["after"]) == (200, ["digits"], 201)
    assert answer["page"] == [507, True]  # the console's form says it too
