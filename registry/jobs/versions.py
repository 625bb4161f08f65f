"""What a job needs of the version it runs: the artifact on disk, the child's memory
limit, and the version's ``metrics``, where benchmark and evaluation results are kept.

Whoever may write the store can rewrite a stored file or put a link in its place, and a
job ran those bytes as the version's: a batch job's outputs, a benchmark's figures and an
evaluation's scores described another model. A job's child is handed the stored file
opened, a link never followed, and reads it once, checks it against the version's sha256
and runs those very bytes (``model_arguments``), or fails naming the version.

Several jobs of one version can finish at the same moment (its benchmark and an
evaluation per data set), each writing its own key of the same JSON column: every write
is a read-modify-write under the version's row lock, so none loses another's key.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from typing import BinaryIO

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.artifacts import storage
from registry.artifacts.inspection import default_memory_limit_bytes
from registry.domain.choices import VersionStatus
from registry.jobs.runner import JobFailed
from registry.models import ModelVersion


@contextlib.contextmanager
def opened_artifact(version: ModelVersion | None) -> Iterator[BinaryIO]:
    """The version's ONNX file, opened for its job's child to read as its stdin; JobFailed
    when there is none to run, or a symbolic link stands in its place."""
    if version is None:
        raise JobFailed("the job names no version")
    if version.status == VersionStatus.ARCHIVED:
        raise JobFailed(f"the artifact of version {version.number} was deleted by retention")
    if not storage.exists(version.sha256):
        raise JobFailed(f"the artifact of version {version.number} is not in the store (the version is {version.status})")
    try:
        opened = storage.open_unfollowed(storage.path_for(version.sha256))
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise JobFailed(f"the stored artifact of {version} is a symbolic link, not the file uploaded: no job follows one; "
                        "nothing was run on it") from None
    with opened:
        yield opened


def model_arguments(version: ModelVersion) -> list[str]:
    """The child's arguments for the model ``opened_artifact`` hands it."""
    return ["--model", "-", "--model-sha256", version.sha256, "--model-name", f"the stored artifact of {version}"]


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
