"""Celery tasks: small arguments, idempotent, translating to registry functions. The
scheduled ones skip a run the database's outage stops; a job's run is sent again
(registry.task_outage)."""

from celery import shared_task

from registry.actions import retention, rollouts, stale_drills
from registry.artifacts import storage
from registry.jobs import records, runner
from registry.task_outage import retried_during_outage, skipped_during_outage


@shared_task(name="registry.tasks.apply_retention")
@skipped_during_outage
def apply_retention() -> int:
    return len(retention.apply_retention())


@shared_task(name="registry.tasks.sweep_staging")
@skipped_during_outage
def sweep_staging() -> int:
    return storage.sweep_stale_staging()


@shared_task(name="registry.tasks.analyse_rollouts", ignore_result=True)
@skipped_during_outage
def analyse_rollouts() -> int:
    """Judge every rollout window that is due (beat runs this every ROLLOUT_TICK_S)."""
    return rollouts.tick()


@shared_task(name="registry.tasks.abandon_stale_drills", ignore_result=True)
@skipped_during_outage
def abandon_stale_drills() -> int:
    """Fail the drills the console stopped during and make the roll forwards drills still
    owe (beat runs this every 30 s): otherwise such a drill says "running" until the
    model's next drill, and a drill an outage cut short leaves its model rolled back."""
    return stale_drills.finish_stale_drills()


@shared_task(name="registry.tasks.run_job", bind=True, ignore_result=True)
@retried_during_outage
def run_job(self, job_id: int) -> str | None:
    """Run one background job (validation, benchmark, evaluation, batch inference).

    A database outage (``claim`` cannot read the job, or its end cannot be written) is one
    warning, not Celery's ERROR and traceback, and the job is not lost: this message is
    sent again with a growing countdown (``self.retry``, bounded), since the job sweep
    resends a sent job only while no other job runs (``records._lost``) and it would wait
    behind a long batch job. Running it twice is safe: ``claim`` runs a queued job once and
    answers None for a job running or finished elsewhere. Where no retry can be sent
    (eager or direct call, broker refused, retries spent) the job stays queued and the
    sweep sends it, as for a send that failed (``records.enqueue``)."""
    return runner.run(job_id)


@shared_task(name="registry.tasks.sweep_jobs", ignore_result=True)
@skipped_during_outage
def sweep_jobs() -> int:
    """Re-queue or fail jobs whose Celery worker died; resend jobs whose send failed."""
    return records.sweep_stale()
