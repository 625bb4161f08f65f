"""Tags, owner, search and archive of registered models through the REST API."""

from __future__ import annotations

import pytest

from registry.actions import releases
from registry.domain.choices import AuditKind
from registry.models import AuditEvent, ModelVersion, RegisteredModel

pytestmark = pytest.mark.django_db


def create(client, **body):
    return client.post("/api/models/", body, format="json")


def names(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [item["name"] for item in response.json()]


def served_model(name: str, operator) -> RegisteredModel:
    model = RegisteredModel.objects.create(name=name)
    version = ModelVersion.objects.create(model=model, number=1, sha256="a" * 64, size_bytes=1, status="ready")
    releases.route_first_version(version, operator)
    return model


# ---------------------------------------------------------------- tags and owner


def test_a_created_model_is_owned_by_its_creator_and_keeps_its_tags(operator_client):
    response = create(operator_client, name="fraud", tags=["cards", "team-risk"])

    assert response.status_code == 201, response.content
    assert (response.json()["tags"], response.json()["owner"], response.json()["archived"]) == (["cards", "team-risk"], "olivia", False)


def test_a_model_may_be_created_for_another_owner_or_none(operator_client, viewer):
    assert create(operator_client, name="a", owner="victor").json()["owner"] == "victor"
    assert create(operator_client, name="b", owner=None).json()["owner"] is None


def test_a_name_differing_from_a_model_s_only_by_case_is_a_409_naming_that_model(operator_client):
    # "MyModel" and "mymodel" were two models: a client that got the case wrong was answered
    # by the other one, with a shape error.
    assert create(operator_client, name="MyModel").status_code == 201

    response = create(operator_client, name="mymodel")

    assert response.status_code == 409, response.content
    assert response.json()["error"] == "a model named 'MyModel' exists: model names must differ by more than case"
    assert list(RegisteredModel.objects.values_list("name", flat=True)) == ["MyModel"]
    assert AuditEvent.objects.filter(kind=AuditKind.MODEL_CREATED).count() == 1


def test_a_model_asked_for_in_another_case_is_a_404_naming_the_one_that_exists(operator_client):
    create(operator_client, name="MyModel")

    response = operator_client.get("/api/models/mymodel/")

    assert response.status_code == 404
    assert response.json()["error"] == "no model named 'mymodel' (names keep their case: did you mean 'MyModel'?)"


def test_the_database_refuses_two_names_differing_only_by_case_whoever_writes_them(db):
    from django.db import IntegrityError, transaction

    RegisteredModel.objects.create(name="fraud")

    with pytest.raises(IntegrityError), transaction.atomic():
        RegisteredModel.objects.create(name="Fraud")


def test_an_unknown_owner_is_a_400(operator_client):
    response = create(operator_client, name="fraud", owner="nobody")

    assert response.status_code == 400
    assert response.json()["error"].startswith("owner:")
    assert RegisteredModel.objects.count() == 0


def test_an_owner_with_a_nul_character_is_a_400_naming_the_owner(operator_client):
    # On PostgreSQL the lookup of such a username failed inside the database: a 500.
    RegisteredModel.objects.create(name="fraud")
    created = create(operator_client, name="other", owner="olivia\x00")
    patched = operator_client.patch("/api/models/fraud/", {"owner": "olivia\x00"}, format="json")

    for response in (created, patched):
        assert response.status_code == 400, response.content
        assert response.json()["error"].startswith("owner:")
        assert "NUL" in response.json()["error"]
    assert RegisteredModel.objects.get(name="fraud").owner is None
    assert not RegisteredModel.objects.filter(name="other").exists()


@pytest.mark.parametrize(
    ("tags", "words"),
    [
        (["Cards"], "lowercase"),
        (["has space"], "lowercase"),
        (["-lead"], "starting with"),
        (["x" * 33], "1 to 32 characters"),
        ([""], "1 to 32 characters"),
        ([f"t{index}" for index in range(11)], "at most 10 tags"),
        (["a", "a"], "once"),
        ([3], "must be a string"),
        ("cards", "must be a list"),
    ],
)
def test_bad_tags_are_a_400_naming_the_problem_and_create_nothing(operator_client, tags, words):
    response = create(operator_client, name="fraud", tags=tags)

    assert response.status_code == 400
    assert response.json()["error"].startswith("tags:")
    assert words in response.json()["error"]
    assert RegisteredModel.objects.count() == 0


def test_patch_changes_tags_and_owner_and_records_it(operator_client, viewer):
    create(operator_client, name="fraud", tags=["cards"])

    response = operator_client.patch("/api/models/fraud/", {"tags": ["cards", "eu"], "owner": "victor"}, format="json")

    assert response.status_code == 200, response.content
    assert (response.json()["tags"], response.json()["owner"]) == (["cards", "eu"], "victor")
    event = AuditEvent.objects.get(kind="model_changed")
    assert event.data == {"changed": {"tags": "cards, eu", "owner": "victor"}}


def test_patch_of_the_analysis_thresholds_is_recorded_naming_each_setting(operator_client):
    # Loosened thresholds switch automatic rollback off for every later rollout: it left no event.
    create(operator_client, name="fraud")
    loosened = {"max_server_error_excess": 1, "failure_limit": 100}

    response = operator_client.patch("/api/models/fraud/", {"analysis": loosened}, format="json")

    assert response.status_code == 200, response.content
    event = AuditEvent.objects.get(kind="model_changed")
    assert event.data == {"changed": {"analysis": "failure_limit 100, max_server_error_excess 1"}}
    assert (event.actor.username, RegisteredModel.objects.get(name="fraud").analysis) == ("olivia", loosened)


def test_patch_of_the_same_analysis_thresholds_again_records_nothing(operator_client):
    create(operator_client, name="fraud")
    operator_client.patch("/api/models/fraud/", {"analysis": {"failure_limit": 3}}, format="json")

    operator_client.patch("/api/models/fraud/", {"analysis": {"failure_limit": 3}}, format="json")

    assert AuditEvent.objects.filter(kind="model_changed").count() == 1


def test_patch_with_bad_tags_changes_nothing(operator_client):
    create(operator_client, name="fraud", tags=["cards"], description="before")

    response = operator_client.patch("/api/models/fraud/", {"tags": ["BAD"], "description": "after"}, format="json")

    assert response.status_code == 400
    model = RegisteredModel.objects.get(name="fraud")
    assert (model.tags, model.description) == (["cards"], "before")


def test_viewer_cannot_change_tags(operator_client, viewer_client):
    create(operator_client, name="fraud", tags=["cards"])

    response = viewer_client.patch("/api/models/fraud/", {"tags": []}, format="json")

    assert response.status_code == 403
    assert RegisteredModel.objects.get(name="fraud").tags == ["cards"]


# ---------------------------------------------------------------- search and filters


@pytest.fixture
def catalogue(operator_client, viewer):
    create(operator_client, name="fraud-cards", description="card fraud scores", tags=["risk", "cards"])
    create(operator_client, name="digits", description="handwritten digits", tags=["cv"], owner="victor")
    create(operator_client, name="churn", description="who leaves", tags=["risk-adjacent"])


def test_q_searches_name_description_and_tags(operator_client, catalogue):
    assert names(operator_client.get("/api/models/", {"q": "FRAUD"})) == ["fraud-cards"]
    assert names(operator_client.get("/api/models/", {"q": "handwritten"})) == ["digits"]
    assert names(operator_client.get("/api/models/", {"q": "risk"})) == ["churn", "fraud-cards"]


def test_tag_filter_matches_whole_tags_only(operator_client, catalogue):
    assert names(operator_client.get("/api/models/", {"tag": "risk"})) == ["fraud-cards"]
    assert names(operator_client.get("/api/models/", {"tag": "ris"})) == []


def test_owner_filter(operator_client, catalogue):
    assert names(operator_client.get("/api/models/", {"owner": "victor"})) == ["digits"]


@pytest.mark.parametrize("name", ["q", "tag", "owner"])
def test_a_filter_with_a_nul_character_is_a_400_naming_it(operator_client, catalogue, name):
    # On PostgreSQL the query itself failed: a 500.
    response = operator_client.get(f"/api/models/?{name}=digits%00")

    assert response.status_code == 400
    assert response.json()["error"] == f"{name}: must not contain NUL (\\u0000) characters"


def test_archived_filter_and_a_bad_value(operator_client, catalogue):
    operator_client.post("/api/models/churn/archive/", {}, format="json")

    assert names(operator_client.get("/api/models/", {"archived": "true"})) == ["churn"]
    assert names(operator_client.get("/api/models/", {"archived": "false"})) == ["digits", "fraud-cards"]
    response = operator_client.get("/api/models/", {"archived": "maybe"})
    assert response.status_code == 400
    assert response.json()["error"] == "archived: must be true or false"


# ---------------------------------------------------------------- archive


def test_archiving_an_unserved_model_hides_it_and_records_why(operator_client):
    create(operator_client, name="draft")

    response = operator_client.post("/api/models/draft/archive/", {"reason": "replaced by fraud-v2"}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["archived"] is True
    assert AuditEvent.objects.get(kind="model_archived").message == "Model draft archived: replaced by fraud-v2"


def test_archiving_a_served_model_stops_serving_it_in_a_release(operator_client, operator):
    served_model("live", operator)

    response = operator_client.post("/api/models/live/archive/", {}, format="json")

    assert response.status_code == 200, response.content
    assert (response.json()["archived"], response.json()["current_release"]["action"]) == (True, "archive")
    assert AuditEvent.objects.get(kind="model_archived").message == "Model live archived; it stopped serving at generation 2"


def test_unarchive_restores_the_model_and_twice_is_a_409(operator_client):
    create(operator_client, name="draft")
    operator_client.post("/api/models/draft/archive/", {}, format="json")

    restored = operator_client.post("/api/models/draft/unarchive/", {}, format="json")
    again = operator_client.post("/api/models/draft/unarchive/", {}, format="json")

    assert (restored.status_code, restored.json()["archived"]) == (200, False)
    assert again.status_code == 409
    assert AuditEvent.objects.filter(kind="model_restored").count() == 1


def test_viewer_cannot_archive(operator_client, viewer_client):
    create(operator_client, name="draft")

    response = viewer_client.post("/api/models/draft/archive/", {}, format="json")

    assert response.status_code == 403
    assert RegisteredModel.objects.get(name="draft").archived_at is None


def test_an_archived_model_does_not_route_a_version_that_becomes_ready(operator_client, operator):
    create(operator_client, name="draft")
    operator_client.post("/api/models/draft/archive/", {}, format="json")
    model = RegisteredModel.objects.get(name="draft")
    version = ModelVersion.objects.create(model=model, number=1, sha256="b" * 64, size_bytes=1, status="ready")

    assert releases.route_first_version(version, operator) is None
    with pytest.raises(releases.ReleaseConflict, match="archived"):
        releases.set_routes(model, [{"version": 1, "weight": 100}], operator)
    assert not model.releases.exists()
