"""Archiving a served model is a release that routes nothing: the desired state leaves the
model out from that generation on (earlier states unchanged), nothing may change its
traffic while archived, and restoring brings back exactly what it served before."""

from __future__ import annotations

import pytest

from registry.actions import catalog, releases, rollouts
from registry.actions.retention import apply_retention
from registry.artifacts import storage
from registry.fleet.series import release_markers
from registry.fleet.state import current_generation, serving_counter, state_at
from registry.models import AuditEvent, RegisteredModel

pytestmark = pytest.mark.django_db
SPLIT = [{"version": 1, "weight": 80}, {"version": 2, "weight": 20}]


def archive(client, name: str = "digits", **body):
    return client.post(f"/api/models/{name}/archive/", body, format="json")


def unarchive(client, name: str = "digits"):
    return client.post(f"/api/models/{name}/unarchive/", {}, format="json")


@pytest.fixture
def split_model(three_versions, operator):
    """``digits`` serving v1 80 % / v2 20 % (generation 2)."""
    releases.set_routes(three_versions, SPLIT, operator)
    return three_versions


def test_archiving_a_served_model_appends_a_release_that_routes_nothing(operator_client, split_model):
    response = archive(operator_client, reason="replaced by digits-v2")

    assert response.status_code == 200, response.content
    current = response.json()["current_release"]
    assert (current["action"], current["routes"], current["stable_version"], current["generation"]) == ("archive", [], 1, 3)
    assert response.json()["archived"] is True
    assert [release["action"] for release in operator_client.get("/api/models/digits/releases/").json()][:2] == ["archive", "set_routes"]


def test_the_state_after_an_archive_leaves_the_model_out_and_earlier_states_are_unchanged(operator_client, split_model):
    _, epoch = serving_counter()
    before = {generation: state_at(generation, epoch) for generation in range(1, current_generation() + 1)}

    archive(operator_client)

    after = state_at(current_generation(), epoch)
    assert "digits" in before[2]["models"] and "digits" not in after["models"]
    assert after["digest"] != before[2]["digest"]
    assert {generation: state_at(generation, epoch) for generation in before} == before


def test_restore_brings_back_the_exact_pre_archive_routes_in_a_new_generation(operator_client, split_model):
    archive(operator_client)

    response = unarchive(operator_client)

    assert response.status_code == 200, response.content
    current = response.json()["current_release"]
    assert (current["action"], current["routes"], current["stable_version"], current["generation"]) == ("restore", SPLIT, 1, 4)
    _, epoch = serving_counter()
    assert state_at(4, epoch)["models"]["digits"]["routes"] == state_at(2, epoch)["models"]["digits"]["routes"]
    assert "traffic is back to v1 80%, v2 20% (generation 4)" in AuditEvent.objects.get(kind="model_restored").message


def test_a_canary_whose_stored_file_changed_while_archived_is_not_brought_back_by_the_restore(operator_client, split_model):
    # Restored unforced to v1 80 / v2 20 while a split to v2 was refused (an attacker's find).
    archive(operator_client)
    path = storage.path_for(split_model.versions.get(number=2).sha256)
    path.write_bytes(path.read_bytes() + b"\0")

    response = unarchive(operator_client)

    assert response.status_code == 200, response.content
    assert response.json()["current_release"]["routes"] == [{"version": 1, "weight": 100}]
    assert ("traffic is back to v1 100% (generation 4), without v2's share: its stored file changed after its upload"
            in AuditEvent.objects.get(kind="model_restored").message)


def test_a_stable_version_whose_stored_file_is_gone_is_not_brought_back_by_the_restore(operator_client, split_model):
    archive(operator_client)
    storage.path_for(split_model.versions.get(number=1).sha256).unlink()

    response = unarchive(operator_client)

    assert response.status_code == 200, response.content
    assert response.json()["current_release"]["action"] == "archive"
    assert ("the stable version it served before cannot be served now (v1: its stored file is missing from the artifact store"
            in AuditEvent.objects.get(kind="model_restored").message)


def test_a_rollback_after_restore_is_what_it_was_before_the_archive(operator_client, split_model):
    archive(operator_client)
    unarchive(operator_client)

    response = operator_client.post("/api/models/digits/release/rollback/", {}, format="json")

    assert response.status_code == 201, response.content
    assert response.json()["release"]["routes"] == [{"version": 1, "weight": 100}]


@pytest.mark.parametrize(("path", "body"), [
    ("release/", {"routes": [{"version": 1, "weight": 100}]}),
    ("release/promote/", {}),
    ("release/rollback/", {}),
    ("release/restore/", {"generation": 1}),
    ("drills/", {}),
    ("rollouts/", {"canary_version": 3}),
])
def test_every_traffic_change_of_an_archived_model_is_a_409(operator_client, split_model, path, body):
    archive(operator_client)

    response = operator_client.post(f"/api/models/digits/{path}", body, format="json")

    assert response.status_code == 409, response.content
    assert "archived" in response.json()["error"]
    assert split_model.current_release().action == "archive"
    assert not split_model.drills.exists()


def test_restoring_the_generation_of_an_archive_is_a_409(operator_client, split_model):
    archive(operator_client)
    unarchive(operator_client)

    response = operator_client.post("/api/models/digits/release/restore/", {"generation": 3}, format="json")

    assert response.status_code == 409
    assert response.json()["error"] == "generation 3 archived digits: archive the model instead of restoring it"
    assert split_model.current_release().action == "restore"


def test_archiving_aborts_the_running_rollout_and_says_why(operator_client, three_versions, operator):
    rollout = rollouts.start(three_versions, 2, [5, 100], 60, {"interval_s": 30}, operator)

    archive(operator_client)

    rollout.refresh_from_db()
    assert rollout.status == "aborted"
    assert rollout.status_reason == "aborted: digits was archived by olivia (generation 3); nothing serves it any more"


def test_restoring_a_model_archived_mid_rollout_serves_its_stable_version_alone(operator_client, three_versions, operator):
    """The archive aborted the rollout, and the restore brought its canary's step back (v2
    at 5 %) with nothing watching it; an aborted rollout leaves stable at 100 % anywhere else."""
    rollout = rollouts.start(three_versions, 2, [5, 100], 60, {"interval_s": 30}, operator)
    archive(operator_client)

    response = unarchive(operator_client)

    assert response.status_code == 200, response.content
    assert response.json()["current_release"]["routes"] == [{"version": 1, "weight": 100}]
    assert (f"traffic is back to v1 100% (generation 4), without v2's share of generation 2: rollout #{rollout.pk}, whose step it was, "
            "was aborted by the archive") in AuditEvent.objects.get(kind="model_restored").message


def test_archiving_mid_rollout_says_a_restore_brings_back_the_stable_version_alone(operator_client, three_versions, operator):
    rollouts.start(three_versions, 2, [5, 100], 60, {"interval_s": 30}, operator)
    assert catalog.archive_preview(three_versions).endswith("restore brings back v1 100%.")

    archive(operator_client)

    assert "a restore brings back v1 100%" in AuditEvent.objects.filter(kind="release").latest("id").message


def test_the_current_release_answer_says_archived_with_no_routes(operator_client, split_model):
    archive(operator_client)

    body = operator_client.get("/api/models/digits/release/").json()

    assert (body["archived"], body["release"]["action"], body["release"]["routes"]) == (True, "archive", [])
    assert (body["rollback_returns_to"], body["rollback_ready"]) == (None, False)


def test_retention_keeps_the_artifacts_an_archived_model_would_serve_again(operator_client, split_model, settings):
    settings.RETENTION_ROLLBACK_DEPTH = 1
    archive(operator_client)

    apply_retention(keep=1)

    assert dict(split_model.versions.values_list("number", "status")) == {1: "ready", 2: "ready", 3: "ready"}
    assert unarchive(operator_client).json()["current_release"]["routes"] == SPLIT


def test_a_model_whose_pre_archive_versions_are_gone_is_restored_by_the_flag_only(operator_client, split_model):
    archive(operator_client)
    split_model.versions.filter(number=2).update(status="archived")

    response = unarchive(operator_client)

    assert response.status_code == 200
    assert (response.json()["archived"], response.json()["current_release"]["action"]) == (False, "archive")
    assert "v2 it served before is no longer ready: it serves nothing until a version is routed" in (
        AuditEvent.objects.get(kind="model_restored").message)
    routed = operator_client.post("/api/models/digits/release/", {"routes": [{"version": 3, "weight": 100}]}, format="json")
    assert routed.status_code == 201, routed.content


def test_a_model_never_served_is_archived_by_the_flag_only(operator_client):
    catalog.create_model("draft", created_by=None)
    generation = current_generation()

    response = archive(operator_client, "draft")

    assert (response.status_code, response.json()["current_release"]) == (200, None)
    assert current_generation() == generation


def test_archive_and_restore_are_audited_and_marked_on_the_charts(operator_client, split_model):
    archive(operator_client)
    unarchive(operator_client)

    kinds = [event.kind for event in AuditEvent.objects.filter(model=split_model).order_by("pk")][-4:]
    assert kinds == ["release", "model_archived", "release", "model_restored"]
    model = RegisteredModel.objects.get(name="digits")
    labels = [marker["label"] for marker in release_markers(model, model.releases.last().created_at, model.current_release().created_at)]
    assert labels[-2:] == ["archived", "restored v2 20%"]


def test_archiving_twice_is_a_409(operator_client, split_model):
    archive(operator_client)

    response = archive(operator_client)

    assert response.status_code == 409
    assert split_model.releases.count() == 3

