"""Where job inputs, job outputs and evaluation data sets live in the artifact store."""

from __future__ import annotations

import shutil
from pathlib import Path

from django.conf import settings


def jobs_root() -> Path:
    return Path(settings.ARTIFACT_ROOT) / "jobs"


def datasets_root() -> Path:
    return Path(settings.ARTIFACT_ROOT) / "datasets"


def job_dir(job) -> Path:
    return jobs_root() / str(job.pk)


def input_path(job) -> Path:
    return job_dir(job) / f"input.{job.input_format}"


def output_path(job) -> Path:
    return job_dir(job) / f"output.{job.output_format or 'out'}"


def dataset_path(dataset) -> Path:
    return datasets_root() / f"{dataset.sha256}.{dataset.file_format}"


def remove_job_files(job) -> None:
    shutil.rmtree(job_dir(job), ignore_errors=True)


def remove_path(path: Path) -> None:
    """A job's folder or a data set's file."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
