"""Retention of job files: a finished job's folder (a batch job's output, anything its
input left) is deleted ``JOB_OUTPUT_RETENTION_S`` after the job finished, and the job
says so (``output_removed_at``; its download then answers 410).

NEVER delete
- the files of a job that is queued or running (its runner reads the input and writes
  the output),
- an output younger than ``JOB_OUTPUT_RETENTION_S``,
- an evaluation data set (``datasets/``): versions uploaded later are evaluated on it.
Rows are never deleted. Jobs are handled in chunks of ``DELETE_CHUNK``.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from registry.domain.choices import TERMINAL_JOB_STATUSES
from registry.jobs import files
from registry.models import Job

logger = logging.getLogger(__name__)
DELETE_CHUNK = 1000


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
