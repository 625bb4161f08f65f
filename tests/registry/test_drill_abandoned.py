"""A drill the console stopped during (SIGKILL mid-drill) is failed by the periodic sweep
once past the longest a live drill takes (3 × DRILL_ACK_TIMEOUT_S + 60 s, 90 s with the
defaults), saying its rollback is still in force and how to restore the split it rolled
back from; before, it said "running" until the model's next drill."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from registry import tasks
from registry.actions import releases
from registry.models import Drill, WorkerAck


@pytest.fixture
def canary(three_versions, operator, settings):
    """``digits``: generation 1 routes v1, generation 2 splits v1 90% / v2 10%. A live
    drill runs 90 s at most (3 × 10 + 60)."""
    settings.DRILL_ACK_TIMEOUT_S = 10.0
    releases.set_routes(three_versions, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], operator)
    return three_versions


def drill_cut_off(model, operator, started_ago_s: float) -> Drill:
    """What a console killed mid-drill leaves: the drill's rollback (generation 3) in
    force and its row running, with no worker rows and no end. The drill was not to roll
    forward: one that was is also rolled forward by the sweep (test_drill_rolled_forward_late.py)."""
    drill = Drill.objects.create(model=model, actor=operator, started_at=timezone.now() - timedelta(seconds=started_ago_s),
                                 target_s=10, roll_forward=False, from_generation=2)
    drill.to_generation = releases.rollback(model, operator, f"rollback drill #{drill.pk}", expected_generation=2).generation
    drill.save(update_fields=["to_generation"])
    return drill


def listed(client, drill: Drill) -> dict:
    return next(row for row in client.get("/api/drills/").json() if row["id"] == drill.pk)


def drill_events(client) -> list[dict]:
    return client.get("/api/models/digits/audit/", {"kind": "drill"}).json()


@pytest.mark.django_db
def test_a_drill_running_past_its_bound_is_failed_by_the_sweep_saying_the_console_stopped(operator_client, canary, operator):
    drill = drill_cut_off(canary, operator, started_ago_s=600)

    tasks.abandon_stale_drills.apply()

    row = listed(operator_client, drill)
    assert row["status"] == "failed"
    assert row["error"].startswith("abandoned: the console stopped during the drill")
    assert "its rollback to generation 3 is still in force unless digits was changed since, and no roll forward was made" in row["error"]
    assert row["error"].endswith("to return to the split it rolled back from (v1 90%, v2 10%, generation 2), restore generation 2")
    assert row["forward_generation"] is None


@pytest.mark.django_db
def test_an_abandoned_drill_lists_the_acks_of_its_rollback_the_console_received_unconfirmed(operator_client, canary, operator):
    """Its workers followed, and the console recorded their acks, but the drill said
    "workers: []": only its dead process would have written them."""
    drill = drill_cut_off(canary, operator, started_ago_s=600)
    acked = WorkerAck.objects.create(worker_id="w-1", generation=drill.to_generation, ok=True)
    WorkerAck.objects.filter(pk=acked.pk).update(received_at=drill.started_at + timedelta(seconds=6.4))
    WorkerAck.objects.create(worker_id="w-old", generation=drill.to_generation - 1, ok=True)  # another generation's

    tasks.abandon_stale_drills.apply()

    [row] = listed(operator_client, drill)["workers"]
    assert (row["worker"], row["ack_s"], row["ok"], row["confirmed_s"]) == ("w-1", 6.4, True, None)
    assert row["error"] == "acked while no drill process watched: no report was looked at"


@pytest.mark.django_db
def test_an_abandoned_drill_s_row_of_an_ack_applied_but_for_another_model_says_so(operator_client, canary, operator):
    """It read as a plain failure: the raw "applied but for other …" and nothing else."""
    drill = drill_cut_off(canary, operator, started_ago_s=600)
    partly = "applied but for other (keeps the routes it served before): other v2: sha256 mismatch"
    WorkerAck.objects.create(worker_id="w-1", generation=drill.to_generation, ok=False, error=partly)

    tasks.abandon_stale_drills.apply()

    [row] = listed(operator_client, drill)["workers"]
    assert row["error"] == f"{partly}; acked while no drill process watched: no report was looked at"


@pytest.mark.django_db
def test_an_abandoned_drill_ends_at_the_latest_it_could_have_finished_not_when_it_was_found(operator_client, canary, operator):
    drill = drill_cut_off(canary, operator, started_ago_s=600)

    tasks.abandon_stale_drills.apply()

    row = listed(operator_client, drill)
    started, finished = datetime.fromisoformat(row["started_at"]), datetime.fromisoformat(row["finished_at"])
    assert finished - started == timedelta(seconds=90)


@pytest.mark.django_db
def test_the_abandonment_is_in_the_model_audit_timeline(operator_client, canary, operator):
    drill = drill_cut_off(canary, operator, started_ago_s=600)

    tasks.abandon_stale_drills.apply()

    [event] = drill_events(operator_client)
    assert event["data"] == {"drill": drill.pk, "status": "failed"}
    assert event["actor"] == "olivia"
    assert event["message"].startswith("Rollback drill failed: abandoned: the console stopped during the drill")
    assert "restore generation 2" in event["message"]


@pytest.mark.django_db
def test_a_drill_within_its_bound_is_left_running(operator_client, canary, operator):
    drill = drill_cut_off(canary, operator, started_ago_s=80)

    tasks.abandon_stale_drills.apply()

    row = listed(operator_client, drill)
    assert (row["status"], row["finished_at"], row["error"]) == ("running", None, "")
    assert drill_events(operator_client) == []


@pytest.mark.django_db
def test_the_bound_follows_the_drill_wait(operator_client, canary, operator, settings):
    settings.DRILL_ACK_TIMEOUT_S = 100.0  # a live drill may run 3 × 100 + 60 = 360 s
    drill = drill_cut_off(canary, operator, started_ago_s=300)

    tasks.abandon_stale_drills.apply()

    assert listed(operator_client, drill)["status"] == "running"


@pytest.mark.django_db
def test_a_second_sweep_changes_nothing(operator_client, canary, operator):
    drill = drill_cut_off(canary, operator, started_ago_s=600)
    tasks.abandon_stale_drills.apply()
    row, events = listed(operator_client, drill), drill_events(operator_client)

    second = tasks.abandon_stale_drills.apply()

    assert second.result == 0
    assert listed(operator_client, drill) == row
    assert drill_events(operator_client) == events


@pytest.mark.django_db
def test_a_drill_that_records_its_end_while_the_sweep_runs_keeps_its_own_result(operator_client, canary, operator):
    drill = drill_cut_off(canary, operator, started_ago_s=600)

    def drill_finishes_first(execute, sql, params, many, context):
        # The drill's own process records its end between the sweep's listing and its UPDATE.
        if sql.startswith('UPDATE "registry_drill"') and not finished:
            finished.append(True)
            Drill.objects.filter(pk=drill.pk).update(status="passed", finished_at=timezone.now(), error="")
        return execute(sql, params, many, context)

    finished: list[bool] = []
    with connection.execute_wrapper(drill_finishes_first):
        result = tasks.abandon_stale_drills.apply()

    assert finished == [True]
    assert result.result == 0
    row = listed(operator_client, drill)
    assert (row["status"], row["error"]) == ("passed", "")
    assert drill_events(operator_client) == []


@pytest.mark.django_db
def test_after_the_sweep_the_restore_it_names_and_a_new_drill_are_accepted(operator_client, canary, operator, settings):
    settings.DRILL_ACK_TIMEOUT_S = 0.2  # no worker answers: the new drill waits this long
    stale = drill_cut_off(canary, operator, started_ago_s=600)
    tasks.abandon_stale_drills.apply()
    abandoned = listed(operator_client, stale)

    restored = operator_client.post("/api/models/digits/release/restore/", {"generation": 2, "reason": "after drill"}, format="json")
    response = operator_client.post("/api/models/digits/drills/", {}, format="json")

    assert restored.status_code == 201
    assert restored.json()["release"]["routes"] == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
    assert response.status_code == 201
    assert (response.json()["from_generation"], response.json()["to_generation"]) == (4, 5)
    assert listed(operator_client, stale) == abandoned
    assert [event["data"]["drill"] for event in drill_events(operator_client)] == [response.json()["id"], stale.pk]


@pytest.mark.django_db
def test_a_drill_still_inside_its_bound_after_the_sweep_still_refuses_another_with_a_409(operator_client, canary, operator):
    running = drill_cut_off(canary, operator, started_ago_s=5)
    tasks.abandon_stale_drills.apply()

    response = operator_client.post("/api/models/digits/drills/", {}, format="json")

    assert response.status_code == 409
    assert response.json()["error"].startswith(f"drill #{running.pk} on digits is still running")
    assert listed(operator_client, running)["status"] == "running"
    assert Drill.objects.count() == 1
