"""A job whose run meets an unavailable database is not lost and logs one warning line,
not Celery's ERROR and traceback: a Celery worker sends it again with a countdown
(``Task.retry``); where no new message can be sent (a direct or eager call) it stays
queued and the job sweep sends it (registry/task_outage.py, ``retried_during_outage``)."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from registry import tasks
from registry.domain.choices import JobKind, JobStatus
from registry.jobs import records, runner
from registry.models import Job, RegisteredModel

OUTAGE = OperationalError("server closed the connection unexpectedly")


def quick_handler(job):
    return {"answer": 42}


@pytest.fixture
def job(db, monkeypatch) -> Job:
    monkeypatch.setitem(runner.HANDLERS, JobKind.BATCH, f"{__name__}.quick_handler")
    # Not sent: a test with a committing database would run it eagerly at once.
    return records.create(JobKind.BATCH, RegisteredModel.objects.create(name="jobs-model"), send=False)


def claim_unreachable(job: Job):
    """The database goes when ``claim`` reads the job."""
    def wrapper(execute, sql, params, many, context):
        if 'FROM "registry_job"' in sql and job.pk in (params or ()):
            raise OUTAGE
        return execute(sql, params, many, context)
    return connection.execute_wrapper(wrapper)


def said(caplog) -> list[tuple[str, str, object]]:
    return [(record.levelname, record.getMessage(), record.exc_info) for record in caplog.records if record.levelno >= logging.WARNING]


def status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


@pytest.fixture
def eager():
    """Sent tasks run at once, in this process, whatever the broker (CI has a Redis)."""
    from console.celery import app

    before, app.conf.task_always_eager = app.conf.task_always_eager, True
    yield
    app.conf.task_always_eager = before


@pytest.mark.django_db
def test_a_direct_run_stopped_by_an_outage_says_so_once_and_the_sweep_sends_the_job_again(job, caplog, eager):
    with claim_unreachable(job):
        assert tasks.run_job(job.pk) is None  # nothing escapes

    assert said(caplog) == [("WARNING", (f"run_job of job {job.pk} stopped: the database is unavailable (OperationalError); "
                                         "the job stays queued for the job sweep to send again"), None)]
    assert status(job) == JobStatus.QUEUED
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(minutes=1))  # never sent: the sweep's

    assert records.sweep_stale() == 1  # sent again, run eagerly

    assert status(job) == JobStatus.SUCCEEDED


@pytest.mark.django_db
def test_an_eager_run_stopped_by_an_outage_logs_one_warning_and_leaves_the_job_queued(job, caplog, eager):
    with claim_unreachable(job):
        tasks.run_job.delay(job.pk)

    assert [(level, exc_info) for level, _, exc_info in said(caplog)] == [("WARNING", None)]
    assert status(job) == JobStatus.QUEUED


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.django_db(transaction=True)  # a real Celery worker thread reads what the test wrote
def test_a_worker_s_run_stopped_by_an_outage_is_sent_again_and_the_job_runs(job, monkeypatch, settings):
    from celery.contrib.testing.worker import start_worker

    from console.celery import app

    settings.JOB_SWEEP_INTERVAL_S = 0.1  # the first retry's countdown
    real_claim, calls = records.claim, []

    def claim(job_id):
        calls.append(job_id)
        if len(calls) == 1:
            raise OUTAGE
        return real_claim(job_id)

    monkeypatch.setattr(records, "claim", claim)
    lines = Lines()  # the worker sets up its own logging: caplog would not see its lines
    watched = [logging.getLogger(name) for name in ("registry", "celery")]
    eager, app.conf.task_always_eager = app.conf.task_always_eager, False
    for logger in watched:
        logger.addHandler(lines)
    try:
        with app.connection_for_write() as broker:  # messages other tests left on a shared broker's queue
            broker.default_channel.queue_purge("jobs")
        with start_worker(app, pool="solo", perform_ping_check=False, queues=["jobs"], shutdown_timeout=10):
            tasks.run_job.delay(job.pk)
            deadline = timezone.now() + timedelta(seconds=15)
            while status(job) != JobStatus.SUCCEEDED and timezone.now() < deadline:
                threading.Event().wait(0.1)
    finally:
        app.conf.task_always_eager = eager
        for logger in watched:
            logger.removeHandler(lines)

    assert calls == [job.pk, job.pk]
    assert status(job) == JobStatus.SUCCEEDED
    assert [(record.levelname, record.getMessage(), record.exc_info) for record in lines.records] == [
        ("WARNING", f"run_job of job {job.pk} stopped: the database is unavailable (OperationalError); sent again in 0.1 s (retry 1 of 8)", None)]
