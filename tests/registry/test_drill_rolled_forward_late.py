"""A drill that asked to roll forward, and whose request an outage cut short for longer
than it retries (DRILL_ACK_TIMEOUT_S; a database failover takes longer), is rolled
forward by the console's sweep once the database answers: over its own rollback only,
once, and said in the drill's summary. Before, the model served what the drill rolled
back to until someone noticed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import OperationalError

from registry import tasks
from registry.actions import drills, releases, rollouts, stale_drills
from registry.models import Drill, Release
from tests.fixtures.threads import run_in_threads

# The drill's rollback must really commit, and its outage retries close the connection.
pytestmark = pytest.mark.django_db(transaction=True)

OUTAGE = OperationalError("server closed the connection unexpectedly")
SPLIT = [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
DRILLS = "/api/models/digits/drills/"


@pytest.fixture
def canary(three_versions, operator, settings):
    """``digits``: generation 1 routes v1, generation 2 splits v1 90% / v2 10%. No worker
    answers, so a drill's waits and outage retries end after DRILL_ACK_TIMEOUT_S."""
    settings.DRILL_ACK_TIMEOUT_S = 0.3
    releases.set_routes(three_versions, SPLIT, operator)
    return three_versions


@pytest.fixture
def database_gone_while_rolling_forward(monkeypatch):
    """The database goes once the drill's end is recorded, for longer than it retries:
    every restore fails. ``back()`` brings it back."""
    restore = releases.restore

    def unavailable(*args, **kwargs):
        raise OUTAGE

    monkeypatch.setattr(releases, "restore", unavailable)
    return lambda: monkeypatch.setattr(releases, "restore", restore)


def cut_short_drill(client) -> Drill:
    response = client.post(DRILLS, {"expected_generation": 2}, format="json")
    assert response.status_code == 503, response.content
    return Drill.objects.get()


def later(drill: Drill, seconds: float = 600) -> None:
    """Time passes: the drill started ``seconds`` ago, past the longest a live one takes."""
    Drill.objects.filter(pk=drill.pk).update(started_at=drill.started_at - timedelta(seconds=seconds))


def current(model) -> Release:
    return model.releases.order_by("-generation").first()


def drill_events(client) -> list[dict]:
    return client.get("/api/models/digits/audit/", {"kind": "drill"}).json()


def listed(client, drill: Drill) -> dict:
    return next(row for row in client.get("/api/drills/").json() if row["id"] == drill.pk)


def test_a_drill_cut_short_while_rolling_forward_says_its_roll_forward_is_pending(operator_client, canary, database_gone_while_rolling_forward):
    drill = cut_short_drill(operator_client)

    row = listed(operator_client, drill)
    assert (row["status"], row["forward_generation"], row["forward_pending"]) == ("failed", None, True)
    assert current(canary).generation == drill.to_generation  # rolled back, for now


def test_the_sweep_rolls_forward_a_drill_the_outage_kept_from_it(operator_client, canary, database_gone_while_rolling_forward):
    drill = cut_short_drill(operator_client)
    database_gone_while_rolling_forward()  # the database is back
    later(drill)

    tasks.abandon_stale_drills.apply()

    release, row = current(canary), listed(operator_client, drill)
    assert (release.action, release.routes, release.reason) == ("restore", SPLIT, f"roll forward after drill #{drill.pk}")
    assert (row["forward_generation"], row["forward_pending"]) == (release.generation, False)
    assert f"rolled forward to generation {release.generation} by the console" in row["error"]
    assert "the workers' acks of it were not watched" in row["error"]


def test_a_drill_whose_end_was_never_recorded_is_failed_and_rolled_forward(operator_client, canary, monkeypatch):
    def unavailable(drill):
        raise OUTAGE

    monkeypatch.setattr(drills, "_record_end", unavailable)
    drill = cut_short_drill(operator_client)
    monkeypatch.undo()
    later(drill)

    tasks.abandon_stale_drills.apply()

    release, row = current(canary), listed(operator_client, drill)
    assert (row["status"], row["forward_generation"], release.routes) == ("failed", release.generation, SPLIT)
    assert row["error"].startswith("abandoned: the console stopped during the drill")
    assert "no roll forward was made" not in row["error"]
    assert "still in force" not in row["error"]  # it said so, then that it was rolled forward
    assert f"; it rolled back to generation {drill.to_generation}, and the roll forward it owes follows; rolled forward to generation {release.generation} by" in row["error"]
    assert row["error"].endswith("started (the drill's own request could not: the database or the console was down); the workers' acks of it were not watched")


def test_a_change_made_after_the_drill_stands_and_the_drill_says_how_to_return(operator_client, operator, canary,
                                                                              database_gone_while_rolling_forward):
    drill = cut_short_drill(operator_client)
    database_gone_while_rolling_forward()
    changed = releases.set_routes(canary, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], operator, "an operator's change")
    later(drill)

    tasks.abandon_stale_drills.apply()

    row = listed(operator_client, drill)
    assert current(canary).generation == changed.generation
    assert (row["forward_generation"], row["forward_pending"]) == (None, False)
    assert row["error"].endswith(f"not rolled forward: digits changed after the drill (generation {changed.generation}), and that change "
                                 "stands: to return to the split it rolled back from (v1 90%, v2 10%, generation 2), restore generation 2")
    [settled, finished] = drill_events(operator_client)
    assert settled["message"] == f"Rollback drill #{drill.pk}: " + row["error"].rsplit("; ", 1)[1]  # in the timeline and its CSV too
    assert finished["message"].startswith("Rollback drill failed:")


def test_the_timeline_says_the_drill_was_rolled_forward_late(operator_client, canary, database_gone_while_rolling_forward):
    drill = cut_short_drill(operator_client)
    database_gone_while_rolling_forward()
    later(drill)

    tasks.abandon_stale_drills.apply()

    newest = drill_events(operator_client)[0]
    assert newest["message"].startswith(f"Rollback drill #{drill.pk}: rolled forward to generation {current(canary).generation}")
    assert newest["actor"] is None  # the console did it, not the operator who ran the drill


def test_a_new_drill_is_refused_while_one_still_owes_its_roll_forward(operator_client, canary, database_gone_while_rolling_forward):
    owing = cut_short_drill(operator_client)
    database_gone_while_rolling_forward()
    generations = Release.objects.count()

    response = operator_client.post(DRILLS, {}, format="json")

    # Its rollback and roll forward would have come between, and the owed one been refused over them.
    assert response.status_code == 409
    assert response.json()["error"].startswith(f"drill #{owing.pk} on digits has not rolled forward yet: the console settles it from")
    assert (Drill.objects.count(), Release.objects.count()) == (1, generations)


def test_a_drill_inside_its_bound_is_left_to_its_own_request(operator_client, canary, database_gone_while_rolling_forward):
    drill = cut_short_drill(operator_client)
    database_gone_while_rolling_forward()
    later(drill, seconds=30)  # a live drill may take 3 × 0.3 + 60 s

    tasks.abandon_stale_drills.apply()

    assert current(canary).generation == drill.to_generation
    assert listed(operator_client, drill)["forward_pending"] is True


def test_a_second_sweep_rolls_forward_nothing_more(operator_client, canary, database_gone_while_rolling_forward):
    drill = cut_short_drill(operator_client)
    database_gone_while_rolling_forward()
    later(drill)
    tasks.abandon_stale_drills.apply()
    row, generations = listed(operator_client, drill), Release.objects.count()

    second = tasks.abandon_stale_drills.apply()

    assert second.result == 0
    assert (listed(operator_client, drill), Release.objects.count()) == (row, generations)


def test_a_roll_forward_the_drill_committed_but_could_not_record_is_found_not_made_again(operator_client, canary, monkeypatch):
    save = Drill.save

    def forward_never_recorded(drill, *args, update_fields=None, **kwargs):
        if update_fields and "forward_generation" in update_fields:
            raise OUTAGE
        return save(drill, *args, update_fields=update_fields, **kwargs)

    monkeypatch.setattr(Drill, "save", forward_never_recorded)
    drill = cut_short_drill(operator_client)
    monkeypatch.undo()
    later(drill)

    tasks.abandon_stale_drills.apply()

    restores = list(canary.releases.filter(action="restore"))
    assert len(restores) == 1  # the drill's own, from before the outage
    assert listed(operator_client, drill)["forward_generation"] == restores[0].generation


def test_a_drill_that_did_not_ask_to_roll_forward_is_not_rolled_forward(operator_client, canary, monkeypatch):
    def unavailable(drill):
        raise OUTAGE

    monkeypatch.setattr(drills, "_record_end", unavailable)
    response = operator_client.post(DRILLS, {"expected_generation": 2, "roll_forward": False}, format="json")
    monkeypatch.undo()
    drill = Drill.objects.get()
    later(drill)

    tasks.abandon_stale_drills.apply()

    assert response.status_code == 503
    assert current(canary).generation == drill.to_generation
    assert listed(operator_client, drill)["error"].endswith("restore generation 2")


def test_a_drill_started_past_the_bound_rolls_the_owed_one_forward_and_says_so_rather_than_run(operator_client, canary,
                                                                                                database_gone_while_rolling_forward):
    stale = cut_short_drill(operator_client)
    database_gone_while_rolling_forward()
    later(stale)
    shown = current(canary).generation  # what the operator's page shows: the stale drill's rollback

    refused = operator_client.post(DRILLS, {"expected_generation": shown}, format="json")
    retried = operator_client.post(DRILLS, {"expected_generation": current(canary).generation}, format="json")

    owed = listed(operator_client, stale)["forward_generation"]
    assert refused.status_code == 409
    # Not "nothing changed": the request's own sweep made a change the operator had not seen.
    assert refused.json()["error"].startswith(f"digits was rolled forward just now by the console: drill #{stale.pk}'s (generation {owed})")
    assert retried.status_code == 201, retried.content
    assert retried.json()["from_generation"] == owed  # it rolled back from the split, not from the old drill's rollback
    assert Release.objects.get(generation=owed).routes == SPLIT


def test_two_sweeps_at_once_roll_forward_once(operator_client, canary, database_gone_while_rolling_forward):
    drill = cut_short_drill(operator_client)
    database_gone_while_rolling_forward()
    later(drill)

    results = run_in_threads(4, lambda index: stale_drills.finish_stale_drills())

    assert sorted(results) == [0, 0, 0, 1], results
    assert canary.releases.filter(action="restore").count() == 1
    assert listed(operator_client, drill)["error"].count("rolled forward to generation") == 1


def test_a_drill_whose_request_stalled_past_the_bound_keeps_what_the_sweep_recorded(operator, canary, monkeypatch):
    watch_workers = drills.watch_workers

    def the_request_stalls_while_the_sweep_runs(drill, *args, **kwargs):
        stale_drills.finish_stale_drills(now=drill.started_at + timedelta(seconds=600))
        return watch_workers(drill, *args, **kwargs)

    monkeypatch.setattr(drills, "watch_workers", the_request_stalls_while_the_sweep_runs)

    drill = drills.run_drill(canary, operator, expected_generation=2)

    assert drill.error.startswith("abandoned: the console stopped during the drill")  # not written over by the stalled request
    assert Release.objects.filter(model=canary, action="restore").count() == 1
    assert drill.forward_generation == current(canary).generation
    finished = [event for event in canary.audit_events.filter(kind="drill") if event.message.startswith("Rollback drill failed")]
    assert len(finished) == 1


def test_a_late_roll_forward_names_the_rollout_the_drills_rollback_paused(operator_client, operator, canary, database_gone_while_rolling_forward):
    rollout = rollouts.start(canary, 2, [20, 50, 100], 0, {"interval_s": 10, "min_requests": 50, "failure_limit": 2}, operator)
    response = operator_client.post(DRILLS, {"expected_generation": rollout.release_generation}, format="json")
    assert response.status_code == 503, response.content
    drill = Drill.objects.get()
    database_gone_while_rolling_forward()
    later(drill)

    tasks.abandon_stale_drills.apply()

    row = listed(operator_client, drill)
    assert f"rolled forward to generation {current(canary).generation}" in row["error"]
    assert f"rollout #{rollout.pk} was paused by the drill's rollback and stays paused until it is resumed" in row["error"]
