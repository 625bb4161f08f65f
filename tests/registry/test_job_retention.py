"""Retention of job files: a finished job's output goes JOB_OUTPUT_RETENTION_S after it
finished (its download then says so with 410); what is queued, running or young stays,
and data sets are never touched."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from registry.actions import datasets, retention
from registry.actions.job_retention import delete_unrecorded_job_files, remove_old_job_files
from registry.domain.choices import JobKind, JobStatus
from registry.jobs import files, records
from registry.models import EvaluationDataset, Job
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


# ---- files no row names: a console killed between moving the file in and its commit


def aged(path, age_s: float):
    """Set ``path`` (and a folder's files) last changed ``age_s`` ago."""
    when = time.time() - age_s
    for each in [path, *(path.iterdir() if path.is_dir() else [])]:
        os.utime(each, (when, when))
    return path


def orphan_job_folder(job_id: int, age_s: float):
    folder = files.job_dir(Job(pk=job_id))
    folder.mkdir(parents=True)
    (folder / "input.npy").write_bytes(b"a batch input whose job row never committed")
    return aged(folder, age_s)


def test_a_job_folder_no_row_names_is_deleted_a_day_after_its_last_change(jobs_model):
    folder = orphan_job_folder(987654, age_s=DAY_S + 60)

    assert delete_unrecorded_job_files() == 1
    assert not folder.exists()


def test_a_young_job_folder_no_row_names_yet_is_kept(jobs_model):
    """Its row may not have committed yet: a batch job's input is moved in inside that transaction."""
    folder = orphan_job_folder(987655, age_s=60)

    assert delete_unrecorded_job_files() == 0
    assert folder.is_dir()


def test_a_data_set_file_no_row_names_is_deleted_and_one_a_row_names_is_kept_however_old(jobs_model):
    dataset = datasets.add(jobs_model, npz_upload("holdout.npz", input=rows(4), labels=np.arange(4)), name="holdout",
                           task="classification", created_by=None)
    kept = aged(files.dataset_path(dataset), 30 * DAY_S)
    orphan = kept.with_name("f" * 64 + ".npz")
    orphan.write_bytes(b"a data set whose row never committed")
    aged(orphan, DAY_S + 60)

    assert delete_unrecorded_job_files() == 1
    assert kept.is_file() and not orphan.exists()


def test_the_beat_retention_deletes_files_no_row_names(jobs_model):
    folder = orphan_job_folder(987656, age_s=2 * DAY_S)

    retention.apply_retention()

    assert not folder.exists()


def test_a_data_set_file_left_by_an_upload_cut_off_and_uploaded_again_survives_a_sweep_during_that_upload(jobs_model, monkeypatch):
    """The sweep found no row for an old file, and deleted it as the row naming it again
    was being saved: a data set whose file was gone (a reviewer's race, forced here)."""
    upload = npz_upload("holdout.npz", input=rows(4), labels=np.arange(4))
    first = datasets.add(jobs_model, upload, name="first", task="classification", created_by=None)
    path = files.dataset_path(first)
    EvaluationDataset.objects.filter(pk=first.pk).delete()  # the row of the upload that was cut off never committed
    aged(path, 2 * DAY_S)
    saving = EvaluationDataset.save

    def swept_first(self, *args, **kwargs):
        delete_unrecorded_job_files()
        return saving(self, *args, **kwargs)

    monkeypatch.setattr(EvaluationDataset, "save", swept_first)

    again = datasets.add(jobs_model, npz_upload("holdout.npz", input=rows(4), labels=np.arange(4)), name="again",
                         task="classification", created_by=None)

    assert files.dataset_path(again) == path and path.is_file()
