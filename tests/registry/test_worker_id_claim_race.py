"""First reports racing for a worker id no one has claimed yet: the first key to report
claims it, every other key is refused (registry/fleet/worker_keys.py). Only PostgreSQL
shows the race (SQLite's IMMEDIATE transactions queue the writers); there the id's
row-lock found nothing to lock, both reports passed the key check, and the last key
overwrote the first's claim, each answered 2xx."""

from __future__ import annotations

import pytest
from django.db import connection

from registry.actions.retention import forget_worker
from registry.fleet import worker_keys
from registry.fleet.workers import record_report
from registry.models import Worker
from tests.fixtures.threads import run_in_threads
from tests.registry.conftest import in_thread
from tests.registry.test_api_fleet import report

pytestmark = pytest.mark.django_db(transaction=True)  # each thread commits on its own connection

ROUNDS = 20  # a fresh id each: before the fix 18 or 19 of 20 ids were accepted under more than one key
RACERS = 4


def report_as(worker_id: str) -> dict:
    message = report()
    return {**message, "worker": {**message["worker"], "id": worker_id}}


def race(worker_id: str, keys: list[str]) -> list:
    """``record_report`` under ``worker_id`` once per key, all at once: each result (a
    Worker) or refusal, in key order."""
    return run_in_threads(len(keys), lambda index: record_report(report_as(worker_id), keys[index]))


def test_of_several_keys_first_reporting_a_new_id_at_once_exactly_one_claims_it_and_the_rest_are_refused():
    lost = {}
    for round_ in range(ROUNDS):
        worker_id, keys = f"w-race-{round_}", [f"key-{round_}-{racer}" for racer in range(RACERS)]
        results = race(worker_id, keys)
        accepted = [key for key, result in zip(keys, results) if isinstance(result, Worker)]
        refused = [result for result in results if isinstance(result, worker_keys.KeyRefused)]
        stored = Worker.objects.get(worker_id=worker_id).key_digest
        if len(accepted) != 1 or len(refused) != RACERS - 1 or stored != worker_keys.digest(accepted[0]):
            lost[worker_id] = f"{len(accepted)} of {RACERS} keys accepted, {len(refused)} refused"

    assert not lost, f"{len(lost)} of {ROUNDS} ids not claimed by exactly one key: {lost}"


def test_the_same_key_first_reporting_a_new_id_several_times_at_once_is_accepted_every_time():
    results = race("w-restarted", ["the-one-key"] * RACERS)  # e.g. a report retried while the first is still in flight

    assert all(isinstance(result, Worker) for result in results), results
    assert Worker.objects.get(worker_id="w-restarted").key_digest == worker_keys.digest("the-one-key")


def in_another_thread(call) -> None:
    """``call()`` on its own database connection, committed before this returns."""
    in_thread(call).join(30)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite's IMMEDIATE transactions hold writers back: no gap to race in")
def test_a_first_report_whose_racing_claimer_is_forgotten_before_its_lock_claims_the_id_itself(monkeypatch):
    # Forced at the gap: another first report of the id commits its claim after this one
    # found no row, and an operator forgets that worker before this one locks the row.
    # The lock found nothing, and the report was a 500.
    insert = Worker.objects.bulk_create

    def racing_insert(rows, **options):
        monkeypatch.setattr(Worker.objects, "bulk_create", insert)
        in_another_thread(lambda: record_report(report_as("w-forgotten"), "the-other-key"))
        inserted = insert(rows, **options)  # nothing: the other's row is there
        in_another_thread(lambda: forget_worker("w-forgotten"))
        return inserted

    monkeypatch.setattr(Worker.objects, "bulk_create", racing_insert)

    worker = record_report(report_as("w-forgotten"), "this-key")

    assert Worker.objects.get(worker_id="w-forgotten").key_digest == worker_keys.digest("this-key") == worker.key_digest
