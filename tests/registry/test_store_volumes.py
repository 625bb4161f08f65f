"""An operator may mount the store's parts as volumes of their own (`ARTIFACT_ROOT/jobs`,
`…/datasets`, `…/sha256`): uploads land in `ARTIFACT_ROOT/tmp`, and moving them across
file systems was EXDEV, answered 500 with the file left staged. Here each part in turn
is a folder on /dev/shm (a tmpfs) while the store is on the test's disk."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from registry.models import EvaluationDataset, Job, ModelVersion
from tests.fixtures.job_world import CLASSES, npy_upload, npz_upload, rows
from tests.fixtures.jobs import validated
from tests.fixtures.mount_namespace import in_a_mount_namespace
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db
REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture
def elsewhere():
    """A folder on another file system than the test's disk, removed afterwards."""
    folder = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="store-volume-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def mounted(artifact_root: Path, part: str, elsewhere: Path) -> Path:
    """``ARTIFACT_ROOT/part`` on the other file system (a link, as a volume's mount point reads)."""
    artifact_root.mkdir(parents=True, exist_ok=True)
    (artifact_root / "tmp").mkdir(exist_ok=True)
    (artifact_root / part).symlink_to(elsewhere, target_is_directory=True)
    assert os.stat(elsewhere).st_dev != os.stat(artifact_root / "tmp").st_dev, "the premise: two file systems"
    return elsewhere


def staged_left(artifact_root: Path) -> list[Path]:
    return [path for path in stored_files(artifact_root) if path.relative_to(artifact_root).parts[0] == "tmp"]


def test_a_data_set_is_stored_on_a_datasets_volume_of_its_own(jobs_model, operator_client, artifact_root, elsewhere):
    volume = mounted(artifact_root, "datasets", elsewhere)

    response = operator_client.post("/api/models/digits/datasets/", {
        "file": npz_upload("holdout.npz", input=rows(6), labels=np.arange(6) % CLASSES), "name": "holdout", "task": "classification"},
        format="multipart")

    assert response.status_code == 201, response.json()
    dataset = EvaluationDataset.objects.get(name="holdout")
    assert [path.name for path in volume.iterdir()] == [f"{dataset.sha256}.npz"]
    assert staged_left(artifact_root) == []


def test_a_batch_input_is_stored_on_a_jobs_volume_of_its_own(jobs_model, operator_client, artifact_root, elsewhere):
    volume = mounted(artifact_root, "jobs", elsewhere)
    upload = npy_upload(rows(10))
    sent = upload.read()
    upload.seek(0)

    response = operator_client.post("/api/models/digits/jobs/", {"input": upload}, format="multipart")

    assert response.status_code == 202, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert (volume / str(job.pk) / "input.npy").read_bytes() == sent
    assert staged_left(artifact_root) == []


def test_a_model_is_stored_on_a_volume_of_its_own(operator_client, operator, artifact_root, elsewhere, good_onnx):
    from registry.models import RegisteredModel

    RegisteredModel.objects.create(name="digits", created_by=operator)
    volume = mounted(artifact_root, "sha256", elsewhere)

    with open(good_onnx, "rb") as handle:
        body = validated(operator_client, operator_client.post("/api/models/digits/versions/", {"artifact": handle}, format="multipart"))

    assert body["status"] == "ready", body
    version = ModelVersion.objects.get(model__name="digits", number=1)
    stored = volume / version.sha256[:2] / version.sha256
    assert stored.read_bytes() == good_onnx.read_bytes()
    assert [path.name for path in stored.parent.iterdir()] == [version.sha256]  # no partial copy beside it
    assert staged_left(artifact_root) == []


MOVE_ONTO_A_FULL_VOLUME = """
import json, sys
from pathlib import Path

import django

django.setup()
from registry.artifacts import storage

store = Path(sys.argv[1])
try:
    storage.move_into(store / "tmp" / "upload", store / "jobs" / "7" / "input.npy")
    print(json.dumps({"moved": True}))
except OSError as error:
    print(json.dumps({"refusal": storage.write_refusal(error), "staged": (store / "tmp" / "upload").exists(),
                      "left": sorted(str(path.relative_to(store)) for path in (store / "jobs").rglob("*") if path.is_file())}))
"""


def test_a_copy_the_other_volume_has_no_room_for_is_removed_and_the_507_names_that_volume(tmp_path):
    """A 64 KiB tmpfs as ARTIFACT_ROOT/jobs, 256 KiB to move there: the 507 said how much was
    free in ARTIFACT_ROOT (81 GB, on the disk) while the volume written to had none."""
    prefix = in_a_mount_namespace()
    store = tmp_path / "store"
    (store / "tmp").mkdir(parents=True)
    (store / "jobs").mkdir()
    (store / "tmp" / "upload").write_bytes(os.urandom(256 * 1024))
    environment = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL"}}
    environment.update(DATA_DIR=str(tmp_path / "data"), ARTIFACT_ROOT=str(store), DJANGO_SETTINGS_MODULE="console.settings",
                       PYTHONPATH=str(REPOSITORY))
    shell = 'mount -t tmpfs -o size=64k tmpfs "$0/jobs" && exec "$1" -c "$2" "$0"'

    finished = subprocess.run([*prefix, "sh", "-c", shell, str(store), sys.executable, MOVE_ONTO_A_FULL_VOLUME],
                              cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=120)

    assert finished.returncode == 0, finished.stderr[-3000:]
    answer = json.loads(finished.stdout.strip().splitlines()[-1])
    status, words = answer["refusal"]
    assert status == 507
    assert re.search(r"no space left on device \(\d+ bytes free in ARTIFACT_ROOT/jobs\)", words), words
    assert (answer["left"], answer["staged"]) == ([], True)  # no partial copy; the staged file is its caller's to discard


def test_a_copy_a_process_left_on_its_way_in_is_swept_with_the_stale_staged_files(artifact_root):
    from registry.artifacts import storage

    old, young = artifact_root / "sha256" / "ab" / ".incoming-x1.partial", artifact_root / "jobs" / ".incoming-x2.partial"
    for path in (old, young):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"part")
    (artifact_root / "tmp").mkdir(exist_ok=True)
    os.utime(old, (0, 0))

    assert storage.sweep_staging(600) == 1
    assert (old.exists(), young.exists()) == (False, True)


def test_a_batch_input_is_brought_to_the_jobs_volume_before_any_lock_is_taken(jobs_model, operator_client, artifact_root, elsewhere,
                                                                               monkeypatch):
    """The copy ran under the generation lock: every release, rollback and drill waited for
    a copy of up to JOB_MAX_INPUT_BYTES (3.04 s for a copy made to take 3 s)."""
    from django.db import connection

    from registry.artifacts import storage

    mounted(artifact_root, "jobs", elsewhere)
    bring, in_transaction, test_depth = storage.brought_to, [], len(connection.atomic_blocks)  # the test's own transaction

    def watched(staged, folder):
        in_transaction.append(len(connection.atomic_blocks) > test_depth)
        return bring(staged, folder)

    monkeypatch.setattr(storage, "brought_to", watched)

    response = operator_client.post("/api/models/digits/jobs/", {"input": npy_upload(rows(10))}, format="multipart")

    assert response.status_code == 202, response.json()
    assert in_transaction == [False]
