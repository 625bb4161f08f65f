"""Retention of job files: a finished job's folder (a batch job's output, anything its
input left) is deleted ``JOB_OUTPUT_RETENTION_S`` after the job finished, and the job
says so (``output_removed_at``; its download then answers 410).

NEVER delete
- the files of a job that is queued or running (its runner reads the input and writes
  the output),
- an output younger than ``JOB_OUTPUT_RETENTION_S``,
- an evaluation data set (``datasets/``): versions uploaded later are evaluated on it.
Rows are never deleted. Jobs are handled in chunks of ``DELETE_CHUNK``.

A data set's file and a batch job's input are moved into place before their row commits:
a console killed in between left them with no row, for good (up to MAX_UPLOAD_BYTES a
kill). ``delete_unrecorded_job_files`` deletes such files once ``UNRECORDED_AFTER_S`` old,
when no row names them; a younger one may be an upload whose row has not committed yet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from registry.domain.choices import TERMINAL_JOB_STATUSES
from registry.jobs import files
from registry.models import EvaluationDataset, Job

logger = logging.getLogger(__name__)
DELETE_CHUNK = 1000
UNRECORDED_AFTER_S = 24 * 3600  # as the model store's unrecorded files (retention.STALE_UPLOAD_S)
ASIDE_SUFFIX = ".aside"


def remove_old_job_files(now=None) -> int:
    """Delete the files of jobs finished before the retention window; returns how many
    jobs were cleared."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.JOB_OUTPUT_RETENTION_S)
    doomed = Job.objects.filter(status__in=TERMINAL_JOB_STATUSES, finished_at__lt=cutoff, output_removed_at__isnull=True)
    cleared = 0
    while ids := list(doomed.order_by("pk").values_list("pk", flat=True)[:DELETE_CHUNK]):
        for job_id in ids:
            files.remove_job_files(Job(pk=job_id))
        # Marked after the files went: a crash in between deletes them again next time.
        cleared += Job.objects.filter(pk__in=ids, output_removed_at__isnull=True).update(output_removed_at=now)
    if cleared:
        logger.info("removed the files of %s job(s) finished before %s", cleared, cutoff.isoformat())
    return cleared


def delete_unrecorded_job_files(now_s: float | None = None) -> int:
    """Delete job folders and data set files that no row names, last changed
    ``UNRECORDED_AFTER_S`` ago or more; returns how many went."""
    cutoff_s = (now_s or time.time()) - UNRECORDED_AFTER_S
    folders = {int(path.name): path for path in _job_folders()}
    recorded = set(Job.objects.filter(pk__in=list(folders)).values_list("pk", flat=True))
    # A job's number is never given twice, and its folder is made inside the transaction
    # that makes its row: one older than the cutoff with no row never gets one.
    doomed = [path for pk, path in folders.items() if pk not in recorded and _changed_before(path, cutoff_s)]
    for path in doomed:
        files.remove_path(path)
        _deleted(path)
    # A data set's file is named by its bytes and reused by an upload of the same bytes
    # (which refreshes it): moved aside before it is judged, as the model store's are.
    gone = [path for path in _dataset_files() if _delete_unnamed_dataset(path, cutoff_s)]
    return len(doomed) + len(gone)


def _delete_unnamed_dataset(path: Path, cutoff_s: float) -> bool:
    original = path.with_name(path.name.removesuffix(ASIDE_SUFFIX))
    aside = original.with_name(original.name + ASIDE_SUFFIX)
    with contextlib.suppress(FileNotFoundError):  # gone, or already aside (a sweep killed midway)
        os.replace(original, aside)
    try:
        keep = not _changed_before(aside, cutoff_s) or _names_a_dataset(original)
    except BaseException:
        _put_back(aside, original)  # no answer (the database is down): the file stays
        raise
    if keep:
        _put_back(aside, original)
        return False
    aside.unlink(missing_ok=True)
    _deleted(original)
    return True


def _put_back(aside: Path, original: Path) -> None:
    with contextlib.suppress(FileNotFoundError):  # none aside, or put back by another sweep
        os.replace(aside, original)  # the same bytes as any copy stored meanwhile


def _deleted(path: Path) -> None:
    logger.warning("deleted %s: no row records it (an upload cut off before its row committed)", path)


def _job_folders() -> list[Path]:
    root = files.jobs_root()
    return [path for path in root.iterdir() if path.is_dir() and path.name.isascii() and path.name.isdigit()] if root.is_dir() else []


def _dataset_files() -> list[Path]:
    root = files.datasets_root()
    # Hidden names are copies on their way in (storage.brought_to): the staging sweep's.
    return [path for path in root.iterdir() if path.is_file() and not path.name.startswith(".")] if root.is_dir() else []


def _names_a_dataset(path: Path) -> bool:
    sha256, _, file_format = path.name.partition(".")  # <sha256>.<format>
    return EvaluationDataset.objects.filter(sha256=sha256, file_format=file_format).exists()


def _changed_before(path: Path, cutoff_s: float) -> bool:
    """Whether its newest change time (a folder's and its files': an input written into an
    old folder is young) is before ``cutoff_s``; False if it went meanwhile."""
    try:
        times = [path.stat().st_mtime] + ([child.stat().st_mtime for child in path.iterdir()] if path.is_dir() else [])
    except FileNotFoundError:
        return False
    return max(times) < cutoff_s
