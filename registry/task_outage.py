"""A Celery task that meets an unavailable database says so in one warning line.

Beat runs the sweeps every few seconds; during a database outage each run failed with
Celery's ERROR and a full traceback (a sweep every 10 s, a rollout tick more often),
burying the one line that says what is wrong. Each of these tasks is idempotent and
its next run does the work, so a run the outage stops is skipped, said in a warning
(``skipped_during_outage``).

A job's task (``registry.tasks.run_job``) has no next run of its own: its message is the
job's turn. A run the outage stops is sent again later (``retried_during_outage``).
"""

from __future__ import annotations

import functools
import logging

from celery.exceptions import Reject
from django.conf import settings
from django.db import DatabaseError

from registry.db_unavailable import is_database_unavailable, missing_schema

logger = logging.getLogger(__name__)
# A job's task is sent again after JOB_SWEEP_INTERVAL_S, doubling up to this, at most
# OUTAGE_RETRIES times (about 20 minutes with the defaults); then the job sweep has it.
OUTAGE_RETRY_MAX_S = 300.0
OUTAGE_RETRIES = 8


def skipped_during_outage(task):
    @functools.wraps(task)
    def run(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except DatabaseError as error:
            if not is_database_unavailable(error):
                raise
            if schema := missing_schema(error):
                logger.error("%s skipped: the database lacks what it needs (%s): it was not migrated, or is not the console's "
                             "(check DATABASE_URL or DATA_DIR; `manage.py migrate`)", task.__name__, schema)
            else:
                logger.warning("%s skipped: the database is unavailable (%s); its next run tries again", task.__name__, type(error).__name__)
            return None
    return run


def retried_during_outage(task):
    """For a bound task (``bind=True``) whose first argument is a job id: a run the outage
    stops is sent again to Celery with a countdown (``Task.retry``), said in one warning,
    and acknowledged. Only safe for a task that may run twice (``records.claim`` runs a job
    once, whatever the number of messages). Where no new message can be sent (the task was
    called directly or eagerly, the broker refused it, or the retries are spent), the job
    stays queued and the job sweep sends it again (``records.sweep_stale``)."""
    @functools.wraps(task)
    def run(self, job_id, *args, **kwargs):
        try:
            return task(self, job_id, *args, **kwargs)
        except DatabaseError as error:
            if not is_database_unavailable(error):
                raise
            outage = type(error).__name__
        request = self.request
        retries = request.retries or 0
        stopped = f"{task.__name__} of job {job_id} stopped: the database is unavailable ({outage})"
        if request.called_directly or request.is_eager or retries >= OUTAGE_RETRIES:
            logger.warning("%s; the job stays queued for the job sweep to send again", stopped)
            return None
        countdown_s = min(settings.JOB_SWEEP_INTERVAL_S * 2**retries, OUTAGE_RETRY_MAX_S)
        try:
            self.retry(countdown=countdown_s, max_retries=OUTAGE_RETRIES, throw=False)
        except Reject as refused:  # what retry raises when the broker refuses the new message
            logger.warning("%s and could not be sent again (%s); the job stays queued for the job sweep to send again",
                           stopped, type(refused.reason).__name__)
            return None
        logger.warning("%s; sent again in %g s (retry %s of %s)", stopped, countdown_s, retries + 1, OUTAGE_RETRIES)
        return None
    return run
