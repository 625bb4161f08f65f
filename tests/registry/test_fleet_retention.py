"""Retention also prunes the fleet's rows: workers gone for long and old acks, never what
the console still reads (a live worker, the current generation's acks, a running drill's,
each worker's newest ack). Run through ``manage.py apply_retention``."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from registry.actions import releases
from registry.domain.choices import DrillStatus
from registry.fleet.workers import record_report
from registry.models import Drill, Worker, WorkerAck
from tests.registry.test_api_fleet import report

pytestmark = pytest.mark.django_db
DAY_S = 24 * 3600


@pytest.fixture
def five_generations(three_versions):
    """digits at generation 5."""
    for number in (2, 3, 1, 2):
        releases.set_routes(three_versions, [{"version": number, "weight": 100}], None)
    return three_versions


def worker_seen(worker_id: str, seconds_ago: float) -> Worker:
    return Worker.objects.create(worker_id=worker_id, host="box", last_seen_at=timezone.now() - timedelta(seconds=seconds_ago))


def ack_received(worker_id: str, generation: int, seconds_ago: float) -> WorkerAck:
    ack = WorkerAck.objects.create(worker_id=worker_id, generation=generation, ok=True)
    WorkerAck.objects.filter(pk=ack.pk).update(received_at=timezone.now() - timedelta(seconds=seconds_ago))
    return ack


def remaining_acks() -> list[tuple[str, int]]:
    return list(WorkerAck.objects.order_by("worker_id", "generation").values_list("worker_id", "generation"))


def apply_retention() -> None:
    call_command("apply_retention", stdout=io.StringIO())


def test_a_worker_unseen_for_longer_than_the_forget_time_is_deleted_with_its_acks(five_generations, viewer_client):
    worker_seen("w-gone", DAY_S + 60)
    ack_received("w-gone", 2, DAY_S + 60)
    ack_received("w-gone", 3, DAY_S + 61)

    apply_retention()

    assert viewer_client.get("/api/workers/?all=1").json() == []
    assert remaining_acks() == []


def test_a_worker_seen_within_the_forget_time_is_kept(five_generations, viewer_client):
    worker_seen("w-idle", DAY_S - 60)

    apply_retention()

    assert [row["worker_id"] for row in viewer_client.get("/api/workers/?all=1").json()] == ["w-idle"]


def test_a_gone_worker_that_reports_while_the_sweep_runs_is_kept(five_generations, viewer_client):
    worker_seen("w-1", DAY_S + 60)
    # Forced at the gap: the worker reports again after the sweep listed it as gone and
    # before the sweep deletes it. It was deleted, a live worker forgotten.
    reported = []

    def report_after_the_listing(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not reported and sql.startswith("SELECT") and "last_seen_at" in sql and "registry_worker" in sql:
            reported.append(sql)  # first: the report's own queries pass through here too
            record_report(report(), None)
        return result

    with connection.execute_wrapper(report_after_the_listing):
        apply_retention()

    assert reported, "the sweep never listed the gone worker"
    assert [row["worker_id"] for row in viewer_client.get("/api/workers/?all=1").json()] == ["w-1"]


def test_the_forget_time_is_a_setting(five_generations, settings):
    settings.WORKER_FORGET_AFTER_S = 600
    worker_seen("w-gone", 601)
    worker_seen("w-idle", 500)

    apply_retention()

    assert list(Worker.objects.values_list("worker_id", flat=True)) == ["w-idle"]


def test_a_live_worker_is_never_forgotten_whatever_the_setting(five_generations, settings):
    settings.WORKER_FORGET_AFTER_S, settings.WORKER_GONE_AFTER_S = 0, 30
    worker_seen("w-live", 10)

    apply_retention()

    assert list(Worker.objects.values_list("worker_id", flat=True)) == ["w-live"]


def test_old_acks_are_deleted_but_each_workers_newest_is_kept(five_generations):
    worker_seen("w-1", 1)
    for generation in (1, 2, 3):
        ack_received("w-1", generation, DAY_S + 100 - generation)
    ack_received("w-1", 4, 60)

    apply_retention()

    assert remaining_acks() == [("w-1", 4)]


def test_the_newest_ack_of_a_worker_is_kept_however_old(five_generations):
    worker_seen("w-1", 1)
    ack_received("w-1", 2, DAY_S * 3)
    ack_received("w-1", 3, DAY_S * 2)

    apply_retention()

    assert remaining_acks() == [("w-1", 3)]


def test_acks_of_the_current_generation_are_kept_however_old_even_of_a_forgotten_worker(five_generations):
    worker_seen("w-gone", DAY_S * 2)
    ack_received("w-gone", 4, DAY_S * 3)
    ack_received("w-gone", 5, DAY_S * 2)

    apply_retention()

    assert (Worker.objects.count(), remaining_acks()) == (0, [("w-gone", 5)])


def test_acks_a_running_drill_waits_for_are_kept(five_generations):
    Drill.objects.create(model=five_generations, status=DrillStatus.RUNNING, from_generation=3, started_at=timezone.now(), target_s=60)
    worker_seen("w-1", 1)
    for generation in (2, 3, 4):
        ack_received("w-1", generation, DAY_S * 2)
    ack_received("w-1", 5, 1)

    apply_retention()

    assert remaining_acks() == [("w-1", 3), ("w-1", 4), ("w-1", 5)]
