"""Where job inputs, job outputs and evaluation data sets live in the artifact store."""

from __future__ import annotations

import shutil
from pathlib import Path

from django.conf import settings


def job_dir(job) -> Path:
    return Path(settings.ARTIFACT_ROOT) / "jobs" / str(job.pk)


def input_path(job) -> Path:
    return job_dir(job) / f"input.{job.input_format}"


def output_path(job) -> Path:
    return job_dir(job) / f"output.{job.output_format or 'out'}"


def dataset_path(dataset) -> Path:
    return Path(settings.ARTIFACT_ROOT) / "datasets" / f"{dataset.sha256}.{dataset.file_format}"


def remove_job_files(job) -> None:
    shutil.rmtree(job_dir(job), ignore_errors=True)
