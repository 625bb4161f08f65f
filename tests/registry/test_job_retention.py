"""Retention of job files: a finished job's output goes JOB_OUTPUT_RETENTION_S after it
finished (its download then says so with 410); what is queued, running or young stays,
and data sets are never touched."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from registry.actions import datasets, retention
from registry.actions.job_retention import remove_old_job_files
from registry.domain.choices import JobKind, JobStatus
from registry.jobs import files, records
from registry.models import Job
from tests.fixtures.job_world import npz_upload, rows

pytestmark = pytest.mark.django_db
DAY_S = 86400.0


def finished_batch_job(model, *, age_s: float, status=JobStatus.SUCCEEDED) -> Job:
    """A batch job that ended ``age_s`` ago with an output file."""
    job = records.create(JobKind.BATCH, model, version=model.versions.get(number=1), input_format="npy", send=False)
    job.output_format = "npy"
    files.job_dir(job).mkdir(parents=True)
    files.output_path(job).write_bytes(b"output")
    Job.objects.filter(pk=job.pk).update(status=status, output_format="npy", output_bytes=6, finished_at=timezone.now() - timedelta(seconds=age_s))
    job.refresh_from_db()
    return job


def test_an_output_past_its_retention_is_deleted_and_its_download_says_so(jobs_model, operator_client, settings):
    settings.JOB_OUTPUT_RETENTION_S = 7 * DAY_S
    job = finished_batch_job(jobs_model, age_s=8 * DAY_S)

    assert remove_old_job_files() == 1

    job.refresh_from_db()
    assert not files.job_dir(job).exists() and job.output_removed_at is not None
    response = operator_client.get(f"/api/models/digits/jobs/{job.pk}/output")
    assert response.status_code == 410
    assert response.json()["error"].startswith(f"the output of job {job.pk} was deleted by retention on ")
    assert operator_client.get(f"/api/models/digits/jobs/{job.pk}/").json()["output_available"] is False


def test_a_young_output_is_kept(jobs_model, operator_client, settings):
    settings.JOB_OUTPUT_RETENTION_S = 7 * DAY_S
    job = finished_batch_job(jobs_model, age_s=6 * DAY_S)

    assert remove_old_job_files() == 0

    response = operator_client.get(f"/api/models/digits/jobs/{job.pk}/output")
    assert (response.status_code, b"".join(response.streaming_content)) == (200, b"output")


def test_the_files_of_an_unfinished_job_are_never_deleted(jobs_model, settings):
    settings.JOB_OUTPUT_RETENTION_S = 60.0
    job = records.create(JobKind.BATCH, jobs_model, version=jobs_model.versions.get(number=1), input_format="npy", send=False)
    files.job_dir(job).mkdir(parents=True)
    files.input_path(job).write_bytes(b"input")
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(days=30))
    records.claim(job.pk)

    assert remove_old_job_files() == 0
    assert files.input_path(job).read_bytes() == b"input"


def test_a_job_is_cleared_once(jobs_model, settings):
    settings.JOB_OUTPUT_RETENTION_S = 60.0
    job = finished_batch_job(jobs_model, age_s=DAY_S, status=JobStatus.FAILED)

    assert remove_old_job_files() == 1
    first = Job.objects.get(pk=job.pk).output_removed_at
    assert remove_old_job_files() == 0
    assert Job.objects.get(pk=job.pk).output_removed_at == first


def test_the_beat_retention_deletes_old_outputs_but_never_a_data_set(jobs_model, settings):
    settings.JOB_OUTPUT_RETENTION_S = 60.0
    dataset = datasets.add(jobs_model, npz_upload("holdout.npz", input=rows(4), labels=np.arange(4)), name="holdout",
                           task="classification", created_by=None)
    job = finished_batch_job(jobs_model, age_s=DAY_S)
    Job.objects.filter(dataset=dataset).update(status=JobStatus.SUCCEEDED, finished_at=timezone.now() - timedelta(days=1))

    retention.apply_retention()

    assert not files.output_path(job).exists()
    assert files.dataset_path(dataset).is_file()


def test_a_viewer_may_not_download_a_job_s_output(jobs_model, viewer_client, operator_client):
    """An output holds the model's answers on an operator's own rows; viewers read jobs,
    not the data behind them (data sets have no download either)."""
    job = finished_batch_job(jobs_model, age_s=60)

    refused = viewer_client.get(f"/api/models/digits/jobs/{job.pk}/output")

    assert refused.status_code == 403
    assert refused.json()["error"] == "a job's output holds the model's answers on an operator's data: operators and admins download it"
    assert operator_client.get(f"/api/models/digits/jobs/{job.pk}/output").status_code == 200
