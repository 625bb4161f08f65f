"""A job runs its version's own bytes or nothing. Whoever may write ARTIFACT_ROOT could
rewrite a stored file (same size, its time set back) or put a symbolic link in its place,
and a batch job answered with the other model's outputs as v1's, a benchmark or an
evaluation kept the other model's figures as v1's, and a validation made the version
ready with the other model's signature. Each job now fails naming the version and what
is wrong, and keeps nothing as the version's result.

Tests run the jobs for real: ``child`` ones ``python -m serving.jobs``, the validation
ones the inspection child."""

from __future__ import annotations

import hashlib
import io
import os
import shutil

import numpy as np
import pytest

from registry.artifacts import storage
from registry.domain.choices import JobKind, JobStatus
from registry.jobs import runner, scheduling
from registry.models import Job, ModelVersion, RegisteredModel
from tests.fixtures.job_world import npy_upload, npz_upload, predictions, rows
from tests.fixtures.jobs import run_queued_jobs
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db
JOBS = "/api/models/digits/jobs/"


def rewrite_in_place(version: ModelVersion, other: ModelVersion) -> None:
    """The other version's bytes written over the version's stored file, its times kept."""
    path = storage.path_for(version.sha256)
    status = path.stat()
    path.write_bytes(storage.path_for(other.sha256).read_bytes())
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))


def link_in_place(version: ModelVersion, other: ModelVersion) -> None:
    """A symbolic link to the other version's stored file where the version's file was."""
    path = storage.path_for(version.sha256)
    path.unlink()
    path.symlink_to(storage.path_for(other.sha256))


def changed(version: ModelVersion, other: ModelVersion) -> str:
    return (f"the stored artifact of {version} does not match its sha256 {version.sha256[:12]}… (its bytes hash to "
            f"{other.sha256[:12]}…): the file changed after its upload; nothing was run on it")


def linked(version: ModelVersion) -> str:
    return f"the stored artifact of {version} is a symbolic link, not the file uploaded: no job follows one; nothing was run on it"


# How the store is tampered with, and the job's refusal of it: (tamper(version, other), refusal(version, other)).
TAMPERINGS = {
    "rewritten": (rewrite_in_place, changed),
    "a link": (link_in_place, lambda version, _other: linked(version)),
}


def versions(model) -> tuple[ModelVersion, ModelVersion]:
    return model.versions.get(number=1), model.versions.get(number=2)


def batch_job(client) -> Job:
    response = client.post(JOBS, {"input": npy_upload(rows(5))}, format="multipart")
    assert response.status_code == 202, response.content
    return Job.objects.get(pk=response.json()["id"])


def job_files(artifact_root) -> list:
    return [path for path in stored_files(artifact_root) if path.relative_to(artifact_root).parts[0] == "jobs"]


def evaluation_job(client, version: ModelVersion) -> Job:
    upload = npz_upload("holdout.npz", input=rows(4), labels=np.array([0, 1, 2, 3]))
    response = client.post("/api/models/digits/datasets/", {"file": upload, "name": "holdout", "task": "classification"}, format="multipart")
    assert response.status_code == 201, response.content
    return Job.objects.get(kind=JobKind.EVALUATION, version=version)


def benchmark_job(version: ModelVersion, settings) -> Job:
    settings.SERVING_DEFAULT_MAX_BATCH_SIZE = 8
    settings.BENCHMARK_SECONDS_PER_SIZE = 0.01
    return scheduling.version_ready(version)[0]


def failure(job: Job) -> tuple[str, str]:
    assert runner.run(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    return job.status, job.error


# ---------------------------------------------------------------- batch inference


@pytest.mark.child
def test_a_batch_job_on_an_untouched_artifact_gives_the_versions_answers(jobs_model, operator_client):
    first, _ = versions(jobs_model)
    job = batch_job(operator_client)

    assert runner.run(job.pk) == JobStatus.SUCCEEDED

    response = operator_client.get(f"{JOBS}{job.pk}/output")
    output = np.load(io.BytesIO(b"".join(response.streaming_content)))
    assert np.array_equal(output.argmax(axis=1), predictions(first, rows(5)))


@pytest.mark.child
@pytest.mark.parametrize("tampering", TAMPERINGS)
def test_a_batch_job_on_an_artifact_tampered_with_in_the_store_fails_naming_the_version_and_keeps_no_output(jobs_model, operator_client,
                                                                                                              artifact_root, tampering):
    tamper, refusal = TAMPERINGS[tampering]
    first, second = versions(jobs_model)
    job = batch_job(operator_client)
    tamper(first, second)

    assert failure(job) == (JobStatus.FAILED, refusal(first, second))
    assert operator_client.get(f"{JOBS}{job.pk}/output").status_code == 409
    assert job_files(artifact_root) == []


# ---------------------------------------------------------------- benchmark and evaluation


@pytest.mark.child
@pytest.mark.parametrize("tampering", TAMPERINGS)
def test_a_benchmark_of_an_artifact_tampered_with_in_the_store_fails_and_keeps_no_figures(jobs_model, settings, tampering):
    tamper, refusal = TAMPERINGS[tampering]
    first, second = versions(jobs_model)
    job = benchmark_job(first, settings)
    tamper(first, second)

    assert failure(job) == (JobStatus.FAILED, refusal(first, second))
    first.refresh_from_db()
    assert "benchmark" not in first.metrics


@pytest.mark.child
@pytest.mark.parametrize("tampering", TAMPERINGS)
def test_an_evaluation_of_an_artifact_tampered_with_in_the_store_fails_and_keeps_no_scores(jobs_model, operator_client, tampering):
    tamper, refusal = TAMPERINGS[tampering]
    first, second = versions(jobs_model)
    job = evaluation_job(operator_client, first)
    tamper(first, second)

    assert failure(job) == (JobStatus.FAILED, refusal(first, second))
    first.refresh_from_db()
    assert "evaluation" not in first.metrics


@pytest.mark.child
def test_an_evaluation_of_an_untouched_artifact_keeps_its_scores(jobs_model, operator_client):
    first, _ = versions(jobs_model)
    job = evaluation_job(operator_client, first)

    assert runner.run(job.pk) == JobStatus.SUCCEEDED
    first.refresh_from_db()
    assert first.metrics["evaluation"]["holdout"]["samples"] == 4


# ---------------------------------------------------------------- validation


def uploaded(client, path) -> ModelVersion:
    with open(path, "rb") as handle:
        response = client.post("/api/models/digits/versions/", {"artifact": handle}, format="multipart")
    assert response.status_code == 202, response.content
    return ModelVersion.objects.get(model__name="digits", number=response.json()["number"])


@pytest.fixture
def digits(operator) -> RegisteredModel:
    return RegisteredModel.objects.create(name="digits", created_by=operator)


def test_a_validation_of_an_upload_rewritten_in_the_store_rejects_it_naming_the_problem(digits, operator_client, good_onnx, good_onnx_v2):
    version = uploaded(operator_client, good_onnx)
    shutil.copyfile(good_onnx_v2, storage.path_for(version.sha256))
    other_sha256 = hashlib.sha256(good_onnx_v2.read_bytes()).hexdigest()

    (job,) = run_queued_jobs("validation")

    version.refresh_from_db()
    assert (job.status, version.status) == (JobStatus.FAILED, "rejected")
    assert job.error == (f"the inspection failed: the stored upload does not match its sha256 {version.sha256[:12]}… (its bytes hash to "
                         f"{other_sha256[:12]}…): the file changed after its upload; nothing was run on it")
    assert version.status_reason == f"validation could not run: {job.error}"


def test_a_validation_of_a_link_in_the_store_rejects_the_upload_naming_the_problem(digits, operator_client, good_onnx, good_onnx_v2):
    version = uploaded(operator_client, good_onnx)
    path = storage.path_for(version.sha256)
    path.unlink()
    path.symlink_to(good_onnx_v2)

    (job,) = run_queued_jobs("validation")

    version.refresh_from_db()
    assert (job.status, version.status) == (JobStatus.FAILED, "rejected")
    assert job.error == ("the inspection failed: the stored upload is a symbolic link, not the file uploaded: no inspection follows one; "
                         "nothing was run on it")
    assert good_onnx_v2.is_file()  # the link went with the version's artifact, never its target
