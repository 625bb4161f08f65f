"""A drill whose rollback is committed when the database goes away is answered as the
traffic actions answer a change the outage cut short: the rollback was made, do not
repeat it (a retry only meets "drill still running"). An outage before the rollback
commits is still the plain 503 to retry, and leaves no drill "running" (a retry runs).
A roll forward that committed before the outage is recorded as made, not taken for
someone else's change when its recording is tried again."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection
from django.test import Client

from registry.actions import drills, releases
from registry.models import Drill, Release
from tests.fixtures.threads import run_in_threads

# The rollback must really commit; and the drill's outage retries close the connection,
# which would end a test's wrapping transaction.
pytestmark = pytest.mark.django_db(transaction=True)

OUTAGE = OperationalError("server closed the connection unexpectedly")


@pytest.fixture
def canary(three_versions, operator, settings):
    """``digits``: generation 1 routes v1, generation 2 splits v1 90% / v2 10%."""
    settings.DRILL_ACK_TIMEOUT_S = 0.3  # no workers: the drill and its outage retries end quickly
    releases.set_routes(three_versions, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], operator)
    return three_versions


@pytest.fixture
def end_not_recordable(monkeypatch):
    """The database goes after the rollback commits, while the drill records its end."""
    def unavailable(drill):
        raise OUTAGE

    monkeypatch.setattr(drills, "_record_end", unavailable)


@pytest.fixture
def browser(operator) -> Client:
    client = Client(raise_request_exception=False)  # what a browser gets: handler500's answers included
    client.force_login(operator)
    return client


def only_drill() -> Drill:
    return Drill.objects.get()


def test_a_drill_whose_end_cannot_be_recorded_says_the_rollback_was_made_not_retry(operator_client, canary, end_not_recordable):
    response = operator_client.post("/api/models/digits/drills/", {"expected_generation": 2}, format="json")

    drill = only_drill()
    assert response.status_code == 503
    assert "Retry-After" not in response
    body = response.json()
    assert body["committed"] == (f"digits: drill #{drill.pk} rolled back to generation 3; "
                                 "the drill's result could not be recorded and it was not rolled forward yet: "
                                 "the console makes it once its database answers (60.9 s after the drill started at the earliest), "
                                 "unless digits is changed first")
    assert body["error"].startswith(f"the change was made ({body['committed']})")
    assert "do not repeat it" in body["error"]
    assert Release.objects.get(model=canary, generation=3).action == "rollback"


def test_a_drill_cut_short_while_rolling_forward_says_its_end_was_recorded(operator_client, canary, monkeypatch):
    def unavailable(*args):
        raise OUTAGE

    monkeypatch.setattr(drills, "_roll_forward", unavailable)

    response = operator_client.post("/api/models/digits/drills/", {"expected_generation": 2}, format="json")

    drill = only_drill()
    assert response.status_code == 503
    assert "Retry-After" not in response
    assert response.json()["committed"] == (f"digits: drill #{drill.pk} rolled back to generation 3, recorded as failed; "
                                            "its roll forward may not have been made: if not, the console makes it once its database "
                                            "answers (60.9 s after the drill started at the earliest), unless digits is changed first")
    assert drill.status == "failed"


def test_a_console_drill_whose_end_cannot_be_recorded_shows_the_rollback_was_made(browser, canary, end_not_recordable):
    response = browser.post("/models/digits/drill/", {"expected_generation": "2", "roll_forward": "on"})

    page = response.content.decode()
    assert response.status_code == 503
    assert "Retry-After" not in response
    assert "Your change was made" in page
    assert f"digits: drill #{only_drill().pk} rolled back to generation 3; the drill&#x27;s result could not be recorded" in page


@pytest.mark.django_db  # nothing commits and nothing is retried: the quicker test database will do
def test_a_drill_whose_rollback_the_database_refuses_is_still_a_503_to_retry(operator_client, canary):
    def fail_the_release_insert(execute, sql, params, many, context):
        if sql.startswith('INSERT INTO "registry_release"'):
            raise OUTAGE
        return execute(sql, params, many, context)

    with connection.execute_wrapper(fail_the_release_insert):
        response = operator_client.post("/api/models/digits/drills/", {"expected_generation": 2}, format="json")

    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json()["error"] == "the database is unavailable; retry in 5 s"
    assert "committed" not in response.json()
    assert list(Release.objects.filter(model=canary).values_list("generation", flat=True).order_by("generation")) == [1, 2]


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
    lose_the_reason = failing_once('UPDATE "registry_drill" SET "forward_pending"')  # and "error", the reason
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
