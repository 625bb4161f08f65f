"""An operator may mount the store's parts as volumes of their own (`ARTIFACT_ROOT/jobs`,
`…/datasets`, `…/sha256`): uploads land in `ARTIFACT_ROOT/tmp`, and moving them across
file systems was EXDEV, answered 500 with the file left staged. Here each part in turn
is a folder on /dev/shm (a tmpfs) while the store is on the test's disk."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from registry.models import EvaluationDataset, Job, ModelVersion
from tests.fixtures.job_world import CLASSES, npy_upload, npz_upload, rows
from tests.fixtures.jobs import validated
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db


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
