"""A worker's report, taken in: kept with its figures all or nothing, then relayed to the
pages and used as the console's fallback tick of overdue rollout windows."""

from __future__ import annotations

import logging

from django.db import transaction

from registry.actions import rollouts
from registry.committed_change import note_pending
from registry.fleet import live
from registry.fleet import workers as fleet
from registry.models import Worker

logger = logging.getLogger(__name__)


def take(report: dict, key: str | None) -> Worker:
    """Keep ``report`` and its figures in one transaction: a database gone midway kept
    nothing, and the worker sends the figures again (``fleet.record_report``'s refusals
    propagate)."""
    with transaction.atomic():
        worker = fleet.record_report(report, key)
        live.store_figures(worker, worker.last_report)  # the figures as the contract parsed them
        note_pending(f"the report of worker {worker.worker_id[:40]!r}")
    return worker


def after(worker: Worker) -> None:
    """Once the report is kept: its figures to the live pages, and the overdue rollout
    windows judged (rollouts.judge_overdue), whose failure is logged and never the
    report's answer, which the worker would send again."""
    live.relay(worker, worker.last_report)
    try:
        rollouts.judge_overdue()
    except Exception as error:
        logger.warning("could not judge the overdue rollout windows (%s: %s); the next report tries again",
                       type(error).__name__, " ".join(str(error).split())[:200])
