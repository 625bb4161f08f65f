"""A request body naming a key its endpoint does not take is a 400 naming the key, and
nothing happens. DRF dropped such keys: a misspelt `expected_generaton` skipped the
stale-page check of a traffic change, a rollout's `stepz` started the default plan."""

from __future__ import annotations

import pytest

from registry.models import Drill, Release, Rollout

pytestmark = pytest.mark.django_db

SPLIT = [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
ROUTES_TAKES = "reason, expected_generation, routes, force"


def error(response) -> str:
    assert response.status_code == 400, response.content
    return response.json()["error"]


def test_a_traffic_change_with_a_misspelt_expected_generation_is_refused_not_made_unchecked(operator_client, three_versions):
    response = operator_client.post("/api/models/digits/release/", {"routes": SPLIT, "expected_generaton": 0}, format="json")

    assert error(response) == f"expected_generaton: this request does not take this field (it takes: {ROUTES_TAKES})"
    assert Release.objects.count() == 1


@pytest.mark.parametrize(("action", "takes"), [("promote", "reason, expected_generation, force"), ("rollback", "reason, expected_generation")])
def test_a_release_action_with_a_key_it_does_not_take_changes_nothing(operator_client, three_versions, action, takes):
    operator_client.post("/api/models/digits/release/", {"routes": SPLIT}, format="json")

    response = operator_client.post(f"/api/models/digits/release/{action}/", {"expected_generaton": 1}, format="json")

    assert error(response) == f"expected_generaton: this request does not take this field (it takes: {takes})"
    assert Release.objects.count() == 2


def test_a_rollout_with_a_misspelt_plan_is_refused_not_started_on_the_default_plan(operator_client, three_versions):
    response = operator_client.post("/api/models/digits/rollouts/", {"canary_version": 2, "stepz": [5, 100]}, format="json")

    assert error(response).startswith("stepz: this request does not take this field (it takes: reason, expected_generation, "
                                      "canary_version, steps,")
    assert not Rollout.objects.exists()
    assert Release.objects.count() == 1


def test_a_rollout_abort_with_a_key_it_does_not_take_leaves_it_running(operator_client, three_versions):
    rollout = operator_client.post("/api/models/digits/rollouts/", {"canary_version": 2}, format="json").json()

    response = operator_client.post(f"/api/models/digits/rollouts/{rollout['id']}/abort/", {"reasn": "typo"}, format="json")

    assert error(response).startswith("reasn: this request does not take this field")
    assert Rollout.objects.get().status == rollout["status"]


def test_a_drill_with_a_key_it_does_not_take_does_not_run(operator_client, three_versions):
    operator_client.post("/api/models/digits/release/", {"routes": SPLIT}, format="json")

    response = operator_client.post("/api/models/digits/drills/", {"roll_fowrard": False}, format="json")

    assert error(response) == "roll_fowrard: this request does not take this field (it takes: roll_forward, expected_generation)"
    assert not Drill.objects.exists()


def test_an_archive_with_a_key_it_does_not_take_leaves_the_model_serving(operator_client, three_versions):
    response = operator_client.post("/api/models/digits/archive/", {"reson": "old"}, format="json")

    assert error(response) == "reson: this request does not take this field (it takes: reason)"
    three_versions.refresh_from_db()
    assert three_versions.archived_at is None


def test_many_unknown_keys_are_named_ten_at_most_and_each_clipped(operator_client, three_versions):
    body = {"routes": SPLIT, **{f"{index:02d}" + "k" * 100: 1 for index in range(12)}}

    response = operator_client.post("/api/models/digits/release/", body, format="json")

    assert response.status_code == 400
    named = response.json()["fields"]
    assert len(named) == 10
    assert all(len(key) == 81 and key.endswith("…") for key in named)  # 80 characters and an ellipsis
