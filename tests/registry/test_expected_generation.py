"""Traffic changes carry the generation the operator saw; a stale one changes nothing.

The generation compared is the one of the model's newest release (what the model page
shows), read under the lock that serialises every traffic change.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from drf_spectacular.generators import SchemaGenerator

from registry.actions import releases
from registry.domain.choices import VersionStatus
from registry.models import AuditEvent, Drill, ModelVersion, RegisteredModel, Release
from tests.fixtures.threads import run_in_threads

RELEASE = "/api/models/digits/release/"

# (path, body) of every traffic action; the canary split below makes each one possible.
ACTIONS = [
    ("", {"routes": [{"version": 3, "weight": 100}]}),
    ("promote/", {}),
    ("rollback/", {}),
    ("restore/", {"generation": 1}),
]


@pytest.fixture
def canary(three_versions, operator):
    """``digits``: generation 1 routes v1, generation 2 splits v1 90% / v2 10%."""
    releases.set_routes(three_versions, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], operator)
    return three_versions


def snapshot() -> tuple:
    return list(Release.objects.values_list("generation", "action", "routes")), AuditEvent.objects.count(), Drill.objects.count()


@pytest.mark.django_db
def test_double_submitted_rollback_rolls_back_once(operator_client, canary):
    first = operator_client.post(RELEASE + "rollback/", {"expected_generation": 2}, format="json")
    after_first = snapshot()

    second = operator_client.post(RELEASE + "rollback/", {"expected_generation": 2}, format="json")

    assert first.status_code == 201, first.content
    assert second.status_code == 409
    body = second.json()
    assert body["error"].startswith("generation 3 (rolled back by olivia at ")
    assert body["error"].endswith(" UTC) replaced generation 2 you saw: nothing changed; reload and decide again")
    assert (body["expected_generation"], body["current_generation"], body["current_action"], body["current_actor"]) == (2, 3, "rollback", "olivia")
    assert snapshot() == after_first
    assert Release.objects.count() == 3
    assert canary.current_release().routes == [{"version": 1, "weight": 100}]


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "body"), ACTIONS)
def test_stale_generation_is_a_conflict_and_changes_nothing(operator_client, canary, path, body, django_capture_on_commit_callbacks):
    before = snapshot()

    with django_capture_on_commit_callbacks() as published:
        response = operator_client.post(RELEASE + path, {**body, "expected_generation": 1}, format="json")

    assert response.status_code == 409
    assert response.json()["error"].startswith("generation 2 (traffic split changed by olivia at ")
    assert response.json()["current_generation"] == 2
    assert snapshot() == before
    assert published == []


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "body"), ACTIONS)
def test_current_generation_lets_the_change_through(operator_client, canary, path, body):
    response = operator_client.post(RELEASE + path, {**body, "expected_generation": 2}, format="json")

    assert response.status_code == 201, response.content
    assert response.json()["release"]["generation"] == 3


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "body"), ACTIONS)
def test_api_clients_may_leave_the_generation_out(operator_client, canary, path, body):
    response = operator_client.post(RELEASE + path, body, format="json")

    assert response.status_code == 201, response.content
    assert Release.objects.count() == 3


@pytest.mark.django_db
def test_conflict_says_how_many_changes_came_after_the_one_seen(operator_client, canary, operator):
    releases.rollback(canary, operator)
    releases.set_routes(canary, [{"version": 3, "weight": 100}], operator)

    response = operator_client.post(RELEASE + "rollback/", {"expected_generation": 2}, format="json")

    assert response.status_code == 409
    assert response.json()["error"].startswith("generation 4 (traffic split changed by olivia at ")
    assert ", the newest of 2 changes since then replaced generation 2 you saw" in response.json()["error"]


@pytest.mark.django_db
def test_generation_from_the_future_is_a_conflict(operator_client, canary):
    response = operator_client.post(RELEASE + "rollback/", {"expected_generation": 7}, format="json")

    assert response.status_code == 409
    assert response.json()["error"].startswith("digits is at generation 2 (traffic split changed by olivia at ")
    assert response.json()["error"].endswith(", not generation 7 as the request says: nothing changed; reload and decide again")
    assert Release.objects.count() == 2


@pytest.mark.django_db
def test_a_change_to_another_model_is_no_conflict(operator_client, canary, operator):
    """Generations are global, but the one compared is the model's own newest release."""
    other = RegisteredModel.objects.create(name="other")
    version = ModelVersion.objects.create(model=other, number=1, status=VersionStatus.READY, sha256="0" * 64, size_bytes=1)
    releases.route_first_version(version, operator)  # generation 3

    response = operator_client.post(RELEASE + "rollback/", {"expected_generation": 2}, format="json")

    assert response.status_code == 201
    assert response.json()["release"]["generation"] == 4


@pytest.mark.django_db
@pytest.mark.parametrize(("value", "words"), [("two", "A valid integer is required."), (-1, "greater than or equal to 0"), (None, "This field may not be null.")])
def test_malformed_generation_is_a_bad_request(operator_client, canary, value, words):
    response = operator_client.post(RELEASE + "rollback/", {"expected_generation": value}, format="json")

    assert response.status_code == 400
    assert response.json()["error"].startswith("expected_generation: ")
    assert words in response.json()["error"]
    assert Release.objects.count() == 2


@pytest.mark.django_db
def test_stale_drill_is_refused_before_it_starts(operator_client, canary):
    before = snapshot()

    response = operator_client.post("/api/models/digits/drills/", {"expected_generation": 1}, format="json")

    assert response.status_code == 409
    assert response.json()["current_generation"] == 2
    assert snapshot() == before


@pytest.mark.django_db
def test_the_schema_documents_expected_generation_as_optional():
    spec = SchemaGenerator().get_schema(request=None, public=True)
    bodies = spec["components"]["schemas"]

    for name in ("SetRoutesRequest", "ReasonRequest", "RestoreRequest", "DrillRequestRequest"):
        assert bodies[name]["properties"]["expected_generation"]["type"] == "integer"
        assert "expected_generation" not in bodies[name].get("required", [])
    conflict = spec["paths"]["/api/models/{name}/release/rollback/"]["post"]["responses"]["409"]
    assert conflict["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/GenerationConflict"}


@pytest.mark.django_db(transaction=True)
def test_two_operators_racing_make_one_change(canary):
    """Each on its own connection, both having seen generation 2: one rolls back, one is told why not."""
    alice, bob = User.objects.create_user("alice"), User.objects.create_user("bob")
    actors = [alice, bob, alice, bob]

    results = run_in_threads(len(actors), lambda index: releases.rollback(canary, actors[index], expected_generation=2))

    made = [result for result in results if isinstance(result, Release)]
    refused = [result for result in results if isinstance(result, releases.GenerationConflict)]
    assert (len(made), len(refused)) == (1, 3), results
    assert all(conflict.details()["current_generation"] == 3 for conflict in refused)
    assert list(Release.objects.order_by("generation").values_list("generation", "action")) == [(1, "initial"), (2, "set_routes"), (3, "rollback")]
