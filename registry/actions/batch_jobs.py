"""Submitting a batch-inference job: a file of inputs run through one ready version.

The file's format comes from its name's extension; it is streamed to disk (never read
whole), checked cheaply (``serving.jobs.formats.check_batch_input``: the arrays' headers,
or the first row) against the inputs of the version it will run on, with the rules of
the job's child, and only then does a job exist. A refused file leaves no file and no
job. Without a version, the job runs on the stable version of the current release.
"""

from __future__ import annotations

import os

from django.conf import settings
from django.db import transaction

from registry.actions import events, received_files
from registry.artifacts import storage
from registry.domain.choices import JobKind, VersionStatus
from registry.jobs import files, records
from registry.jobs.batch import MAX_BATCH_SIZE
from registry.models import Job, ModelVersion, RegisteredModel, ServingGeneration
from serving.jobs import formats

INPUT_FORMATS = ("npy", "npz", "jsonl", "csv")


class JobRefused(received_files.Refused):
    """A batch job that is not queued: 400 bad file or format, 404 unknown version, 409
    version not ready (or no stable version), 413 too large."""


def submit(model: RegisteredModel, upload, *, version_number: int | None = None, batch_size: int | None = None, created_by) -> Job:
    """Queue a batch job over ``upload`` (a Django ``UploadedFile``); returns it."""
    file_format = received_files.extension(upload, INPUT_FORMATS, "the input file", JobRefused)
    version = resolve_version(model, version_number)
    batch_size = resolve_batch_size(batch_size)
    staged = received_files.stage(upload, settings.JOB_MAX_INPUT_BYTES, "JOB_MAX_INPUT_BYTES", "the input file", JobRefused)
    try:
        rows = _check(staged, file_format, version)
        return _create(model, version, staged, file_format, rows, batch_size, getattr(upload, "name", "") or "", created_by)
    finally:
        storage.discard(staged)  # moved into the job's folder by now, or refused


def resolve_version(model: RegisteredModel, number: int | None) -> ModelVersion:
    if number is None:
        release = model.current_release()
        if release is None:
            raise JobRefused(f"model {model.name} has no stable version yet: name the version to run", 409)
        number = release.stable_version
    if isinstance(number, bool) or not isinstance(number, int):
        raise JobRefused("version must be a version number", 400)
    version = model.versions.filter(number=number).first()
    if version is None:
        raise JobRefused(f"model {model.name} has no version {number}", 404)
    if version.status != VersionStatus.READY:
        raise JobRefused(f"version {number} is {version.status}: only a ready version runs batch jobs", 409)
    return version


def resolve_batch_size(batch_size: int | None) -> int:
    if batch_size is None:
        return settings.BATCH_JOB_BATCH_SIZE
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise JobRefused(f"batch_size must be a whole number from 1 to {MAX_BATCH_SIZE}", 400)
    return batch_size


def _check(staged: storage.StagedArtifact, file_format: str, version: ModelVersion) -> int | None:
    """Rows of an array file (None for .jsonl and .csv: counted as the job runs)."""
    layouts = formats.signature_layouts(version.signature)
    try:
        rows = formats.check_batch_input(staged.path, file_format, layouts)
    except formats.InputMismatch as error:
        raise JobRefused(f"the input file does not fit version {version.number}: {error.reason} "
                         f"(version {version.number} takes {formats.describe_inputs(layouts)})", 400) from None
    except formats.FormatError as error:
        raise JobRefused(f"the input file cannot be used: {error.reason}", 400) from None
    if rows == 0:
        raise JobRefused("the input file cannot be used: its arrays have no rows", 400)
    return rows


def _check_still_ready(version: ModelVersion) -> None:
    status = ModelVersion.objects.filter(pk=version.pk).values_list("status", flat=True).first()
    if status != VersionStatus.READY:
        raise JobRefused(f"version {version.number} is {status or 'gone'}: only a ready version runs batch jobs", 409)


def _create(model, version, staged, file_format: str, rows: int | None, batch_size: int, input_name: str, created_by) -> Job:
    job = None
    # On the jobs folder's file system before the lock below: a copy there (a volume of its
    # own) of up to JOB_MAX_INPUT_BYTES held every release, rollback and drill meanwhile.
    beside = storage.brought_to(staged.path, files.jobs_root())
    try:
        with transaction.atomic():
            # Retention decides what to keep under this lock, and keeps the version of a queued
            # batch job: checked again under it, a version archived while the input was read
            # (seconds for a large file) is refused here, not failed once the job runs.
            ServingGeneration.objects.lock()
            _check_still_ready(version)
            job = records.create(JobKind.BATCH, model, version=version, params={"batch_size": batch_size}, created_by=created_by,
                                 input_format=file_format, input_name=input_name, send=False)
            if rows is not None:
                job.total = rows
                job.save(update_fields=["total"])
            target = files.input_path(job)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(beside, target)
            events.batch_job_submitted(job, created_by)
            records.enqueue(job)
    except BaseException:
        beside.unlink(missing_ok=True)
        if job is not None:
            files.remove_job_files(job)
        raise
    return job
