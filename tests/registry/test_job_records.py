"""A job's life through registry.jobs.records and runner: one run per job, whatever is
delivered twice; a runner that went silent is replaced or the job fails; a cancel wins."""

from __future__ import annotations

import logging
import sqlite3
import time
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from registry.domain.choices import JobKind, JobStatus
from registry.jobs import records, runner
from registry.models import Job, RegisteredModel

pytestmark = pytest.mark.django_db


@pytest.fixture
def model() -> RegisteredModel:
    return RegisteredModel.objects.create(name="jobs-model")


def failing_handler(job):
    raise runner.JobFailed("the input file is truncated")


def crashing_handler(job):
    raise KeyError("surprise")


def succeeding_handler(job):
    records.progress(job, 5, 10, force=True)
    return {"answer": 42}


OUTAGES = []  # how many more runs the database "goes away" under


def locked_database_handler(job):
    raise OperationalError("database is locked") from sqlite3.OperationalError("database is locked")


def outage_then_success_handler(job):
    if OUTAGES:
        OUTAGES.pop()
        raise OperationalError("server closed the connection unexpectedly")  # as Django raises it when PostgreSQL goes
    return {"answer": 42}


def slow_handler(job):
    time.sleep(0.5)
    return {}


@pytest.fixture
def handler(monkeypatch):
    def use(function) -> None:
        monkeypatch.setitem(runner.HANDLERS, JobKind.BATCH, f"{__name__}.{function.__name__}")
    return use


def test_a_job_with_the_same_key_is_created_once(model):
    first = records.create(JobKind.BENCHMARK, model, key="benchmark:1")
    second = records.create(JobKind.BENCHMARK, model, key="benchmark:1")
    assert first.pk == second.pk and Job.objects.count() == 1


def test_a_queued_job_is_claimed_once(model):
    job = records.create(JobKind.BATCH, model)
    claimed = records.claim(job.pk)
    assert claimed.status == JobStatus.RUNNING and claimed.attempts == 1
    assert records.claim(job.pk) is None


def test_an_unknown_job_is_not_run():
    assert runner.run(10**9) is None


def test_a_handler_result_is_the_job_result(model, handler):
    handler(succeeding_handler)
    job = records.create(JobKind.BATCH, model)
    assert runner.run(job.pk) == JobStatus.SUCCEEDED
    job.refresh_from_db()
    assert job.result == {"answer": 42} and job.done == 10 and job.total == 10 and job.finished_at is not None


def test_a_clean_failure_keeps_its_reason(model, handler):
    handler(failing_handler)
    job = records.create(JobKind.BATCH, model)
    assert runner.run(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert job.error == "the input file is truncated"


def test_an_unexpected_error_fails_the_job_naming_where_to_look(model, handler):
    handler(crashing_handler)
    job = records.create(JobKind.BATCH, model)
    assert runner.run(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert "KeyError" in job.error and "Celery worker's log" in job.error


def test_a_job_cancelled_while_queued_never_runs(model, handler):
    handler(succeeding_handler)
    job = records.create(JobKind.BATCH, model)
    records.cancel(job)
    assert runner.run(job.pk) is None
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED and job.result == {}


def test_cancelling_a_running_job_asks_its_runner_to_stop(model):
    job = records.claim(records.create(JobKind.BATCH, model).pk)
    records.cancel(job)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and records.cancel_requested(job)


def _silence(job: Job, seconds: float) -> None:
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def test_a_silent_running_job_is_queued_again(model, settings):
    settings.JOB_STALE_AFTER_S, settings.JOB_MAX_ATTEMPTS = 30, 2
    job = records.claim(records.create(JobKind.BATCH, model).pk)
    _silence(job, 31)
    assert records.sweep_stale() >= 1
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED and "queued again" in job.error


def test_a_silent_job_on_its_last_attempt_fails_saying_its_worker_stopped(model, settings):
    settings.JOB_STALE_AFTER_S, settings.JOB_MAX_ATTEMPTS = 30, 1
    job = records.claim(records.create(JobKind.BATCH, model).pk)
    _silence(job, 31)
    records.sweep_stale()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "Celery worker stopped" in job.error


@pytest.mark.parametrize("attempts_left", [True, False])
def test_a_silent_job_someone_cancelled_ends_cancelled_not_queued_again_or_failed(model, settings, attempts_left):
    """Its runner was killed, then an operator cancelled it: the sweep queued it again (to
    run after all) or failed it as the worker's fault (a fault test, 7 Dec)."""
    settings.JOB_STALE_AFTER_S, settings.JOB_MAX_ATTEMPTS = 30, 2 if attempts_left else 1
    job = records.claim(records.create(JobKind.BATCH, model).pk)
    records.cancel(job)
    _silence(job, 31)

    assert records.sweep_stale() >= 1

    job.refresh_from_db()
    assert (job.status, job.error) == (JobStatus.CANCELLED, "cancelled (its runner had stopped, so it ended here)")
    assert job.finished_at is not None


def test_a_job_with_a_fresh_heartbeat_is_left_running(model, settings):
    settings.JOB_STALE_AFTER_S = 30
    job = records.claim(records.create(JobKind.BATCH, model).pk)
    _silence(job, 5)
    records.sweep_stale()
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


@pytest.fixture
def host_clock(monkeypatch):
    """Set this host's clock ``offset_s`` off the database's (timezone.now; the database's
    own clock is untouched)."""
    real_now = timezone.now

    def set_offset(offset_s: float) -> None:
        monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=offset_s))

    return set_offset


def test_a_runner_on_a_host_whose_clock_is_behind_keeps_its_job(model, settings, host_clock):
    """A jobs host 45 s behind wrote heartbeats that read 45 s old: the sweep took its live
    job for lost and ran it twice. Heartbeats are the database's time."""
    settings.JOB_STALE_AFTER_S = 30
    host_clock(-45)
    job = records.claim(records.create(JobKind.BATCH, model).pk)
    records.heartbeat(job)
    host_clock(0)

    records.sweep_stale()

    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_a_sweep_on_a_host_whose_clock_is_ahead_leaves_a_live_job_running(model, settings, host_clock):
    settings.JOB_STALE_AFTER_S = 30
    job = records.claim(records.create(JobKind.BATCH, model).pk)
    host_clock(100)

    records.sweep_stale()

    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_a_sweep_on_a_host_whose_clock_is_behind_still_finds_a_silent_job(model, settings, host_clock):
    settings.JOB_STALE_AFTER_S, settings.JOB_MAX_ATTEMPTS = 30, 2
    job = records.claim(records.create(JobKind.BATCH, model).pk)
    _silence(job, 31)
    host_clock(-100)

    assert records.sweep_stale() >= 1

    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED


def test_a_runner_that_lost_its_claim_cannot_finish_the_job(model, settings):
    settings.JOB_STALE_AFTER_S, settings.JOB_MAX_ATTEMPTS = 30, 3
    stale = records.claim(records.create(JobKind.BATCH, model).pk)
    _silence(stale, 31)
    records.sweep_stale()
    fresh = records.claim(stale.pk)
    assert records.succeed(stale, {"from": "the old runner"}) is False
    assert records.succeed(fresh, {"from": "the new runner"}) is True
    fresh.refresh_from_db()
    assert fresh.result == {"from": "the new runner"} and fresh.attempts == 2


def test_progress_gives_a_rate_and_an_eta(model):
    job = records.claim(records.create(JobKind.BATCH, model).pk)
    started_s = time.monotonic() - 2.0
    job._progress_origin = (started_s, 0)  # as if started two seconds ago
    records.progress(job, 100, 400, force=True)
    # Read at a moment between 2 s and now: a loaded box took 0.45 s more and the ETA read 7.4 s for 6 ± 1.2.
    elapsed_s = time.monotonic() - started_s
    job.refresh_from_db()
    assert 100 / elapsed_s <= job.rate_per_s <= 100 / 2.0
    assert job.eta_s == pytest.approx(300 / job.rate_per_s)


def test_the_payload_names_the_model_and_says_whether_an_output_exists(model):
    job = records.create(JobKind.BATCH, model, input_format="npy", input_name="rows.npy")
    shown = records.payload(job)
    assert shown["model"] == "jobs-model" and shown["status"] == "queued" and shown["output_available"] is False


def _sent(job: Job, seconds_ago: float) -> None:
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds_ago))


def test_a_job_queued_long_ago_while_nothing_runs_is_sent_again(model, settings):
    settings.JOB_STALE_AFTER_S = 30
    lost = records.create(JobKind.BATCH, model)
    _sent(lost, 31)  # its message was lost: an idle worker would have taken it by now

    assert records.sweep_stale() == 1
    lost.refresh_from_db()
    assert lost.status == JobStatus.QUEUED and lost.heartbeat_at > timezone.now() - timedelta(seconds=5)  # sent just now


def test_a_job_waiting_behind_a_running_one_is_not_sent_again(model, settings):
    settings.JOB_STALE_AFTER_S = 30
    records.claim(records.create(JobKind.BATCH, model).pk)  # running, heartbeat fresh
    waiting = records.create(JobKind.BATCH, model)
    _sent(waiting, 31)

    assert records.sweep_stale() == 0


def test_a_job_the_database_left_while_it_ran_is_queued_again_with_its_attempt_given_back(model, handler):
    handler(outage_then_success_handler)
    OUTAGES[:] = [1]
    job = records.create(JobKind.BATCH, model)

    status = runner.run(job.pk)

    job.refresh_from_db()
    assert (status, job.attempts, job.error) == ("queued", 0, "attempt 1 was interrupted by a database outage; queued again")


def test_two_database_outages_during_a_job_do_not_use_up_its_attempts(model, handler, settings):
    # Each left it running for the sweep, which counted it: a good upload's validation
    # failed "its Celery worker stopped while it ran" after two short outages.
    settings.JOB_MAX_ATTEMPTS = 2
    handler(outage_then_success_handler)
    OUTAGES[:] = [1, 1]
    job = records.create(JobKind.BATCH, model)

    statuses = [runner.run(job.pk) for _ in range(3)]

    job.refresh_from_db()
    assert statuses == ["queued", "queued", "succeeded"]
    assert (job.status, job.attempts, job.result) == (JobStatus.SUCCEEDED, 1, {"answer": 42})


@pytest.mark.django_db(transaction=True)  # the heartbeat thread writes through a connection of its own
def test_a_heartbeat_failing_through_an_outage_is_one_warning_not_a_traceback_a_beat(model, handler, settings, monkeypatch, caplog):
    settings.JOB_HEARTBEAT_S = 0.05
    handler(slow_handler)
    beat = records.heartbeat
    failures = [1] * 4

    def heartbeat_through_an_outage(job):
        if failures:
            failures.pop()
            raise OperationalError("server closed the connection unexpectedly")
        return beat(job)

    monkeypatch.setattr(records, "heartbeat", heartbeat_through_an_outage)
    with caplog.at_level(logging.WARNING, logger="registry.jobs.runner"):
        assert runner.run(records.create(JobKind.BATCH, model).pk) == "succeeded"

    warnings = [record for record in caplog.records if "heartbeat of job" in record.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None


def test_an_error_of_a_database_that_still_answers_fails_the_job_rather_than_queueing_it_for_ever(model, handler):
    # A lock, a timeout or a full disk comes back at every run: given back, it looped.
    handler(locked_database_handler)
    job = records.create(JobKind.BATCH, model)

    assert runner.run(job.pk) == "failed"


def test_a_runner_whose_attempt_was_given_back_holds_nothing_once_it_is_claimed_again(model):
    # The next claim takes the same attempt number: the old runner retrying its give-back
    # (its first went through, the answer did not) or a sweep that listed the job before
    # must not take the new run for theirs.
    first = records.claim(records.create(JobKind.BATCH, model).pk)
    as_the_old_runner_knew_it = Job.objects.get(pk=first.pk)
    records.give_back(first)
    time.sleep(0.001)  # claims a moment apart, as runners' are
    records.claim(first.pk)

    records.give_back(as_the_old_runner_knew_it)

    assert Job.objects.get(pk=first.pk).status == JobStatus.RUNNING
