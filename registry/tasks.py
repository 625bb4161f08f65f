"""Celery tasks: small arguments, idempotent, translating to registry functions. The
scheduled ones skip a run the database's outage stops (registry.task_outage)."""

from celery import shared_task

from registry.actions import retention, rollouts
from registry.artifacts import storage
from registry.jobs import records, runner
from registry.task_outage import skipped_during_outage


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


@shared_task(name="registry.tasks.run_job", ignore_result=True)
def run_job(job_id: int) -> str | None:
    """Run one background job (validation, benchmark, evaluation, batch inference)."""
    return runner.run(job_id)


@shared_task(name="registry.tasks.sweep_jobs", ignore_result=True)
@skipped_during_outage
def sweep_jobs() -> int:
    """Re-queue or fail jobs whose Celery worker died; resend jobs whose send failed."""
    return records.sweep_stale()
