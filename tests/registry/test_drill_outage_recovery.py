"""A drill the database outage interrupts leaves nothing that lies once the database is
back: a drill whose rollback was not made is not left "running" (its 503 says retry, and
a retry runs), and a roll forward that committed before the outage is recorded as made,
not taken for someone else's change when its recording is tried again."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection

from registry.actions import drills, releases
from registry.models import Drill, Release
from tests.fixtures.threads import run_in_threads

# The drill's transactions must really commit (or really roll back), and its outage
# retries close the connection, which would end a test's wrapping transaction.
pytestmark = pytest.mark.django_db(transaction=True)

OUTAGE = OperationalError("server closed the connection unexpectedly")


@pytest.fixture
def canary(three_versions, operator, settings):
    """``digits``: generation 1 routes v1, generation 2 splits v1 90% / v2 10%."""
    settings.DRILL_ACK_TIMEOUT_S = 0.3  # no workers: the drill and its outage retries end quickly
    releases.set_routes(three_versions, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], operator)
    return three_versions


def failing_once(statement_starts: str):
    """An ``execute_wrapper`` that loses the database on the first statement starting with
    ``statement_starts``, before it runs; the calls it failed are counted in ``failed``."""
    def wrapper(execute, sql, params, many, context):
        if not wrapper.failed and sql.startswith(statement_starts):
            wrapper.failed += 1
            raise OUTAGE
        return execute(sql, params, many, context)

    wrapper.failed = 0
    return wrapper


def generations(model) -> list[tuple[int, str]]:
    return list(Release.objects.filter(model=model).order_by("generation").values_list("generation", "action"))


def test_a_drill_whose_rollback_the_outage_refused_is_not_left_running_and_a_retry_runs(operator_client, canary):
    refuse_the_rollback = failing_once('INSERT INTO "registry_release"')
    with connection.execute_wrapper(refuse_the_rollback):
        refused = operator_client.post("/api/models/digits/drills/", {"expected_generation": 2}, format="json")

    assert refuse_the_rollback.failed == 1
    assert refused.status_code == 503
    assert refused["Retry-After"] == "5"
    assert refused.json()["error"] == "the database is unavailable; retry in 5 s"
    left = list(Drill.objects.values_list("status", flat=True)), generations(canary)

    retried = operator_client.post("/api/models/digits/drills/", {"expected_generation": 2}, format="json")

    assert retried.status_code == 201, retried.json()  # not "drill #… is still running" for 90 s
    assert left == ([], [(1, "initial"), (2, "set_routes")])  # neither the drill nor its rollback was made
    drill = retried.json()
    assert (drill["from_generation"], drill["to_generation"], drill["forward_generation"]) == (2, 3, 4)
    assert Drill.objects.count() == 1
    assert generations(canary)[2:] == [(3, "rollback"), (4, "restore")]


def test_a_roll_forward_committed_before_the_outage_is_recorded_as_made(canary, operator):
    lose_the_record = failing_once('UPDATE "registry_drill" SET "forward_generation"')
    with connection.execute_wrapper(lose_the_record):
        drill = drills.run_drill(canary, operator, expected_generation=2)

    assert lose_the_record.failed == 1  # the restore had committed when the database went
    drill = Drill.objects.get(pk=drill.pk)
    assert (drill.to_generation, drill.forward_generation) == (3, 4)
    assert "changed during the drill" not in drill.error
    assert drill.error == "no live workers to follow the rollback"
    assert generations(canary)[2:] == [(3, "rollback"), (4, "restore")]  # rolled forward once


def test_a_reason_the_outage_kept_from_being_recorded_is_said_once_when_recorded_again(canary, operator, monkeypatch):
    watch_workers = drills.watch_workers

    def an_operator_changes_the_model_meanwhile(*args, **kwargs):
        releases.set_routes(canary, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], operator)
        return watch_workers(*args, **kwargs)

    monkeypatch.setattr(drills, "watch_workers", an_operator_changes_the_model_meanwhile)
    lose_the_reason = failing_once('UPDATE "registry_drill" SET "error"')
    with connection.execute_wrapper(lose_the_reason):
        drill = drills.run_drill(canary, operator, expected_generation=2)

    assert lose_the_reason.failed == 1  # the roll forward's conflict, while it was recorded
    drill = Drill.objects.get(pk=drill.pk)
    assert drill.forward_generation is None
    assert drill.error == ("no live workers to follow the rollback; "
                           "not rolled forward: digits changed during the drill (generation 4), and that change stands")


def test_two_drills_started_together_make_one_drill_and_the_other_is_told_one_runs(canary, operator, settings):
    settings.DRILL_ACK_TIMEOUT_S = 0.2

    results = run_in_threads(2, lambda index: drills.run_drill(canary, operator, expected_generation=2))

    made = [result for result in results if isinstance(result, Drill)]
    refused = [result for result in results if isinstance(result, releases.ReleaseConflict)]
    assert (len(made), len(refused)) == (1, 1), results
    assert isinstance(refused[0], drills.DrillRunning), refused[0]
    assert refused[0].message.startswith(f"drill #{made[0].pk} on digits is still running")
    assert Drill.objects.count() == 1
    assert [generation for generation, action in generations(canary) if action == "rollback"] == [3]
