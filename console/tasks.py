"""Celery tasks of the console's own: small arguments, idempotent, translating to functions."""

from celery import shared_task

from console import sign_in_records
from registry.task_outage import skipped_during_outage


@shared_task(name="console.tasks.prune_sign_in_records", ignore_result=True)
@skipped_during_outage
def prune_sign_in_records() -> dict[str, int]:
    return sign_in_records.prune()
