"""A rollback after an abort to stable (the console's "Abort to stable", a rollout's
abort) through the API: the abort is itself a rollback of the canary, so "Roll back"
walks on past it and never sends traffic back to the aborted canary."""

from __future__ import annotations

import pytest

from registry.actions import rollouts
from registry.models import Release

pytestmark = pytest.mark.django_db

RELEASE = "/api/models/digits/release/"


def split(client, routes):
    response = client.post(RELEASE, {"routes": routes}, format="json")
    assert response.status_code == 201, response.content


def abort_to_stable(model, operator):
    """What the console's "Abort to stable" button does (there is no API route for it)."""
    release, _ = rollouts.back_to_stable(model, operator, "canary looks wrong")
    return release


def test_after_abort_to_stable_there_is_nothing_to_roll_back_to_when_stable_served_alone_before(operator_client, three_versions, operator):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    abort_to_stable(three_versions, operator)
    count = Release.objects.count()

    returns_to = operator_client.get(RELEASE).json()["rollback_returns_to"]
    response = operator_client.post(RELEASE + "rollback/", {}, format="json")

    assert returns_to is None
    assert response.status_code == 409 and response.json()["error"].startswith("nothing to roll back to")
    assert Release.objects.count() == count


def test_a_rollback_after_an_aborted_rollout_does_not_bring_the_canary_back(operator_client, three_versions):
    rollout = operator_client.post("/api/models/digits/rollouts/", {"canary_version": 2, "steps": [10, 100]}, format="json").json()
    operator_client.post(f"/api/models/digits/rollouts/{rollout['id']}/abort/", {"reason": "wrong version"}, format="json")

    returns_to = operator_client.get(RELEASE).json()["rollback_returns_to"]
    response = operator_client.post(RELEASE + "rollback/", {}, format="json")

    assert returns_to is None
    assert response.status_code == 409
    assert three_versions.current_release().routes == [{"version": 1, "weight": 100}]


def test_a_rollback_after_an_abort_walks_past_every_split_of_the_canary(operator_client, three_versions, operator):
    split(operator_client, [{"version": 3, "weight": 100}])  # generation 2
    split(operator_client, [{"version": 3, "weight": 90}, {"version": 2, "weight": 10}])
    split(operator_client, [{"version": 3, "weight": 50}, {"version": 2, "weight": 50}])
    abort_to_stable(three_versions, operator)  # v3 100%, as generation 2

    returns_to = operator_client.get(RELEASE).json()["rollback_returns_to"]
    response = operator_client.post(RELEASE + "rollback/", {}, format="json")

    # Where a rollback from generation 2 goes: the abort stands in for it.
    assert returns_to == "v1 100% (generation 1)"
    assert response.json()["release"]["routes"] == [{"version": 1, "weight": 100}]


def test_a_rollback_after_an_abort_walks_past_an_earlier_attempt_at_the_same_canary(operator_client, three_versions, operator):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    split(operator_client, [{"version": 1, "weight": 100}])
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])  # the second attempt
    abort_to_stable(three_versions, operator)

    returns_to = operator_client.get(RELEASE).json()["rollback_returns_to"]
    response = operator_client.post(RELEASE + "rollback/", {}, format="json")

    assert returns_to is None
    assert response.status_code == 409
    assert three_versions.current_release().routes == [{"version": 1, "weight": 100}]


def test_a_rollback_after_aborting_the_old_stable_as_a_canary_is_refused_saying_the_abort_ended_the_chain(operator_client, three_versions, operator):
    split(operator_client, [{"version": 1, "weight": 90}, {"version": 3, "weight": 10}])
    operator_client.post(RELEASE + "promote/", {}, format="json")  # generation 3: v3 100%, a rollback returns to v1 100%
    split(operator_client, [{"version": 3, "weight": 90}, {"version": 1, "weight": 10}])
    abort_to_stable(three_versions, operator)  # generation 5: v3 100%
    count = Release.objects.count()

    state = operator_client.get(RELEASE).json()
    response = operator_client.post(RELEASE + "rollback/", {}, format="json")

    assert (state["rollback_returns_to"], state["release"]["rollback_target_generation"]) == (None, None)
    assert response.status_code == 409
    assert response.json()["error"] == (
        "nothing to roll back to: the abort of v1 at generation 5 ended the rollback chain — every earlier split on it routes v1 "
        "or serves v3 100%, as generation 5 does; restore an earlier generation from the history instead")
    assert Release.objects.count() == count
