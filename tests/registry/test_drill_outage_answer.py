"""A drill whose rollback is committed when the database goes away is answered as the
traffic actions answer a change the outage cut short: the rollback was made, do not
repeat it (a retry only meets "drill still running"). An outage before the rollback
commits is still the plain 503 to retry."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection
from django.test import Client

from registry.actions import drills, releases
from registry.models import Drill, Release

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
                                 "the drill's result could not be recorded and it was not rolled forward")
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
                                            "its roll forward may not have been made")
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
