"""What a job needs of the version it runs: the artifact on disk, the child's memory
limit, and the version's ``metrics``, where benchmark and evaluation results are kept.

Several jobs of one version can finish at the same moment (its benchmark and an
evaluation per data set), each writing its own key of the same JSON column: every write
is a read-modify-write under the version's row lock, so none loses another's key.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.artifacts import storage
from registry.artifacts.inspection import default_memory_limit_bytes
from registry.domain.choices import VersionStatus
from registry.jobs.runner import JobFailed
from registry.models import ModelVersion


def artifact_path(version: ModelVersion | None) -> Path:
    """The version's ONNX file; JobFailed when there is none to run."""
    if version is None:
        raise JobFailed("the job names no version")
    if version.status == VersionStatus.ARCHIVED:
        raise JobFailed(f"the artifact of version {version.number} was deleted by retention")
    if not storage.exists(version.sha256):
        raise JobFailed(f"the artifact of version {version.number} is not in the store (the version is {version.status})")
    return storage.path_for(version.sha256)


def memory_limit_bytes(version: ModelVersion) -> int:
    return settings.JOB_MEMORY_LIMIT_BYTES or default_memory_limit_bytes(version.size_bytes)


def measured(result: dict, job, **extra) -> dict:
    """A job's result as it is kept in the version's metrics: with where it came from."""
    return {**result, **extra, "job": job.pk, "measured_at": timezone.now().isoformat()}


def store_metric(version: ModelVersion, key: str, value: dict, *, entry: str | None = None) -> dict:
    """Set ``metrics[key]`` (or ``metrics[key][entry]``) of the version, under its row
    lock; returns the metrics as written."""
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk)
        metrics = dict(locked.metrics or {})
        if entry is None:
            metrics[key] = value
        else:
            existing = metrics.get(key)
            metrics[key] = {**(existing if isinstance(existing, dict) else {}), entry: value}
        locked.metrics = metrics
        locked.save(update_fields=["metrics"])
    version.metrics = metrics
    return metrics
