"""Run one job: claim it, keep its heartbeat, call its kind's handler, record the end.

A handler is ``handler(job) -> dict`` (the job's result). It raises ``JobFailed`` for a
failure it can explain (a corrupt file, a model that does not fit the data) and
``JobCancelled`` when it stopped because the job was cancelled. Anything else is a bug:
logged with its traceback, and the job fails saying where to look.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.utils.module_loading import import_string

from registry.db_unavailable import is_connection_lost, is_database_unavailable
from registry.domain.choices import JobKind
from registry.jobs import records
from registry.models import Job

logger = logging.getLogger(__name__)
OUTAGE_POLL_S = 1.0  # how often a runner the database left asks whether it is back

HANDLERS = {
    JobKind.VALIDATION: "registry.jobs.validation.run",
    JobKind.BENCHMARK: "registry.jobs.benchmark.run",
    JobKind.EVALUATION: "registry.jobs.evaluation.run",
    JobKind.BATCH: "registry.jobs.batch.run",
}


class JobFailed(Exception):
    """The job cannot succeed; ``reason`` is a sentence for whoever reads the job."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class JobRetry(Exception):
    """This attempt could not finish for a reason another attempt may not meet (a row lock
    held past DATABASE_LOCK_TIMEOUT_S): queued again, counted; failed with ``reason`` once
    the job has used JOB_MAX_ATTEMPTS."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class JobCancelled(Exception):
    """The handler stopped because the job was cancelled."""


def run(job_id: int) -> str | None:
    """Run the job if it is queued; returns the status it ended in, None if not run."""
    job = records.claim(job_id)
    if job is None:
        return None
    handler = import_string(HANDLERS[job.kind])
    with _heartbeats(job):
        try:
            result = handler(job)
        except JobCancelled:
            records.cancelled(job)
        except JobFailed as failure:
            records.fail(job, failure.reason)
        except JobRetry as retry:
            records.try_again(job, retry.reason)
        except Exception as error:
            if not is_connection_lost(error):  # a lock or a full disk would come back at every run
                logger.exception("job %s (%s) failed unexpectedly", job.pk, job.kind)
                records.fail(job, f"the job failed unexpectedly ({type(error).__name__}); the Celery worker's log has the details (job {job.pk})")
            elif not _given_back_after_outage(job, error):
                raise  # the task's outage handling says so, and the job sweep has it
        else:
            records.succeed(job, result or {})
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).first()


def _given_back_after_outage(job: Job, error: BaseException) -> bool:
    """The database went while the job ran (its progress, its cancel poll): not the job's
    fault. Left ``running``, it waited for the stale sweep, which counted the attempt: two
    short outages failed a good upload's validation, "its Celery worker stopped". The
    runner waits for the database (up to JOB_STALE_AFTER_S) and queues the job again with
    its attempt given back (True); after a longer outage the sweep has it, as before."""
    logger.warning("job %s (%s): the database became unavailable while it ran (%s); waiting for it to give the attempt back",
                   job.pk, job.kind, type(error).__name__)
    deadline_s = time.monotonic() + settings.JOB_STALE_AFTER_S
    while time.monotonic() < deadline_s:
        if not connection.in_atomic_block:  # a test's transaction; a runner's lost connection is replaced
            close_old_connections()
        try:
            records.give_back(job)
            return True
        except DatabaseError as still:
            if not is_database_unavailable(still):
                raise
        time.sleep(OUTAGE_POLL_S)
    return False


@contextlib.contextmanager
def _heartbeats(job: Job) -> Iterator[None]:
    """Write the job's heartbeat every JOB_HEARTBEAT_S while the handler runs, from a
    thread, so a handler blocked in one long call still counts as alive. Inside an
    uncommitted transaction (tests) another connection could not see the row: the
    handler's own progress calls keep the heartbeat there."""
    if connection.in_atomic_block:
        yield
        return
    stop = threading.Event()
    beat = threading.Thread(target=_beat, args=(job, stop), name=f"job-{job.pk}-heartbeat", daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join(timeout=5)


def _beat(job: Job, stop: threading.Event) -> None:
    failing = False
    try:
        while not stop.wait(settings.JOB_HEARTBEAT_S):
            try:
                records.heartbeat(job)
                failing = False
            except Exception as error:  # a database blip: the next beat tries again
                # One line per outage: a traceback every beat filled the log while the runner
                # waited for the database to give its attempt back.
                if not failing:
                    logger.warning("heartbeat of job %s failed (%s: %s); retrying every %g s", job.pk, type(error).__name__,
                                   str(error).strip()[:200], settings.JOB_HEARTBEAT_S)
                failing = True
                close_old_connections()
    finally:
        connection.close()
