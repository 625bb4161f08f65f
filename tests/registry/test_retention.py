"""Retention archives old versions and deletes their artifacts, never a routed one."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.management import call_command
from django.utils import timezone

from registry.actions import releases, rollouts, uploads
from registry.actions.retention import apply_retention
from registry.artifacts import storage
from registry.building.onnx_build import random_mlp, to_bytes
from registry.domain.choices import JobKind, JobStatus
from registry.fleet.state import issued_digest
from registry.models import Drill, Job, ModelVersion

pytestmark = pytest.mark.django_db


def add_versions(model, seeds):
    return [uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([8, 4], seed=seed))), uploaded_by=None) for seed in seeds]


def statuses(model):
    return dict(model.versions.values_list("number", "status"))


def test_only_the_newest_versions_keep_their_artifacts(three_versions, settings):
    settings.RETENTION_ROLLBACK_DEPTH = 1
    add_versions(three_versions, [10])
    releases.set_routes(three_versions, [{"version": 4, "weight": 100}], AnonymousUser())
    releases.set_routes(three_versions, [{"version": 3, "weight": 100}], AnonymousUser())
    releases.set_routes(three_versions, [{"version": 4, "weight": 100}], AnonymousUser())

    archived = apply_retention(keep=2)

    assert [version.number for version in archived] == [1, 2]
    assert statuses(three_versions) == {1: "archived", 2: "archived", 3: "ready", 4: "ready"}


def test_retention_never_deletes_a_routed_version(three_versions):
    add_versions(three_versions, [10, 11])  # versions 4 and 5; version 1 stays stable

    apply_retention(keep=1)

    version_one = ModelVersion.objects.get(model=three_versions, number=1)
    assert version_one.status == "ready"
    assert storage.exists(version_one.sha256)
    assert statuses(three_versions) == {1: "ready", 2: "archived", 3: "archived", 4: "archived", 5: "ready"}


def test_versions_a_few_rollbacks_away_are_kept(three_versions):
    actor = AnonymousUser()
    releases.set_routes(three_versions, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], actor)
    releases.promote(three_versions, actor)  # 2 at 100%; a rollback returns to 1 at 100%
    add_versions(three_versions, [10])

    apply_retention(keep=1)

    assert statuses(three_versions) == {1: "ready", 2: "ready", 3: "archived", 4: "ready"}
    releases.rollback(three_versions, actor)
    assert three_versions.current_release().routes == [{"version": 1, "weight": 100}]


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.RUNNING])
def test_the_version_of_an_unfinished_job_keeps_its_artifact(three_versions, status):
    version_two = ModelVersion.objects.get(model=three_versions, number=2)
    Job.objects.create(kind=JobKind.BATCH, model=three_versions, version=version_two, status=status)

    apply_retention(keep=1)

    assert statuses(three_versions) == {1: "ready", 2: "ready", 3: "ready"}  # 3 is the newest, 1 routed
    assert storage.exists(version_two.sha256)


def test_the_version_of_a_finished_job_may_go(three_versions):
    version_two = ModelVersion.objects.get(model=three_versions, number=2)
    for status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
        Job.objects.create(kind=JobKind.BATCH, model=three_versions, version=version_two, status=status)

    apply_retention(keep=1)

    assert statuses(three_versions)[2] == "archived"


def test_archived_version_keeps_its_metadata_and_loses_its_file(three_versions, operator_client):
    add_versions(three_versions, [10])
    version_two = ModelVersion.objects.get(model=three_versions, number=2)

    apply_retention(keep=1)

    version_two.refresh_from_db()
    assert version_two.status == "archived"
    assert version_two.archived_at is not None
    assert version_two.signature["inputs"][0]["name"] == "input"
    assert not storage.exists(version_two.sha256)
    assert operator_client.get("/api/models/digits/versions/2/artifact").status_code == 410


def test_shared_bytes_stay_while_any_version_needs_them(three_versions):
    same = ModelVersion.objects.get(model=three_versions, number=2)
    uploads.register_stream(three_versions, io.BytesIO(to_bytes(random_mlp([8, 4], seed=1))), uploaded_by=None)  # v4 = v2's bytes

    apply_retention(keep=1)

    assert ModelVersion.objects.get(model=three_versions, number=2).status == "archived"
    assert storage.exists(same.sha256)


def test_archived_version_cannot_be_routed(three_versions, operator_client):
    add_versions(three_versions, [10])
    apply_retention(keep=1)

    response = operator_client.post("/api/models/digits/release/", {"routes": [{"version": 2, "weight": 100}]}, format="json")

    assert response.status_code == 400
    assert response.json()["error"] == "version 2 is archived: it cannot take traffic"


def test_management_command_reports_what_it_archived(three_versions, capsys):
    add_versions(three_versions, [10])

    call_command("apply_retention", "--keep", "1")

    assert "2 version(s) archived" in capsys.readouterr().out


def route_each_in_turn(model, settings) -> None:
    """Versions 1..4, each routed at 100% in turn; retention may keep one rollback."""
    settings.RETENTION_ROLLBACK_DEPTH = 1
    add_versions(model, [10])
    for number in (2, 3, 4):
        releases.set_routes(model, [{"version": number, "weight": 100}], AnonymousUser())


def test_versions_beyond_the_rollback_depth_may_go(three_versions, settings):
    actor = AnonymousUser()
    route_each_in_turn(three_versions, settings)

    apply_retention(keep=1)

    assert statuses(three_versions) == {1: "archived", 2: "archived", 3: "ready", 4: "ready"}
    releases.rollback(three_versions, actor)
    with pytest.raises(releases.ReleaseConflict, match="no longer ready"):
        releases.rollback(three_versions, actor)


def test_a_rollback_past_the_retention_depth_leaves_no_archived_version_in_the_workers_state(three_versions, settings, worker_client):
    # The state's warm list named the archived version: its artifact answered 410 and
    # every worker refused the whole state, for every model, from then on.
    route_each_in_turn(three_versions, settings)
    apply_retention(keep=1)
    releases.rollback(three_versions, AnonymousUser())  # to v3; its own rollback target routes the archived v2

    state = worker_client.get("/api/serving/state").json()["models"]["digits"]

    assert [route["version"] for route in state["routes"]] == [3]
    assert state["warm"] == []
    for entry in state["routes"]:
        assert worker_client.get(entry["artifact_url"]).status_code == 200


def test_no_rollback_is_offered_that_would_be_refused(three_versions, settings, operator, operator_client, client):
    route_each_in_turn(three_versions, settings)
    apply_retention(keep=1)
    releases.rollback(three_versions, AnonymousUser())
    client.force_login(operator)

    page = client.get("/models/digits/").content.decode()

    assert operator_client.get("/api/models/digits/release/").json()["rollback_returns_to"] is None
    assert 'id="rollback-button"' not in page and 'id="drill-button"' not in page
    assert "No rollback: v2 of digits is no longer ready (archived or rejected)." in page


def test_a_state_s_digest_does_not_change_when_retention_later_archives_a_version_it_kept_warm(three_versions, settings):
    settings.RETENTION_ROLLBACK_DEPTH = 1
    releases.set_routes(three_versions, [{"version": 2, "weight": 100}], AnonymousUser())  # keeps v1 warm
    releases.set_routes(three_versions, [{"version": 3, "weight": 100}], AnonymousUser())  # keeps v2 warm: v1 may go
    issued = {generation: issued_digest(generation) for generation in (1, 2, 3)}

    archived = apply_retention(keep=1)

    assert [version.number for version in archived] == [1]
    assert {generation: issued_digest(generation) for generation in (1, 2, 3)} == issued


def test_the_state_workers_fetch_never_lists_an_archived_version_whatever_the_clocks_say(three_versions, worker_client):
    releases.set_routes(three_versions, [{"version": 2, "weight": 100}], AnonymousUser())  # keeps v1 warm
    v1 = three_versions.versions.get(number=1)
    v1.status, v1.archived_at = "archived", timezone.now() + timedelta(hours=1)  # a clock ahead: "after" the release
    v1.save()

    state = worker_client.get("/api/serving/state").json()

    assert state["models"]["digits"]["warm"] == []


def split_then_rolled_back(model, canary: int):
    """``model`` split v1 90% / ``canary`` 10%, then rolled back: the release a drill rolls
    forward to, and the rollback in force."""
    split = releases.set_routes(model, [{"version": 1, "weight": 90}, {"version": canary, "weight": 10}], AnonymousUser())
    releases.set_routes(model, [{"version": 1, "weight": 95}, {"version": 3, "weight": 5}], AnonymousUser())  # a change between
    return split, releases.set_routes(model, [{"version": 1, "weight": 100}], AnonymousUser())


@pytest.mark.parametrize("owed", ["running", "roll forward pending"])
def test_the_version_a_drill_will_roll_forward_to_keeps_its_artifact(three_versions, settings, owed):
    """A drill rolls back, then restores the split it rolled back from: retention archived
    the canary in between (an hourly run, a drill waiting on a stopped worker), and the
    roll forward failed for good with the model left on its stable version."""
    settings.RETENTION_ROLLBACK_DEPTH = 1
    add_versions(three_versions, [10, 11, 12])  # v4-v6: v2 is past the newest three
    split, _ = split_then_rolled_back(three_versions, canary=2)
    Drill.objects.create(model=three_versions, started_at=timezone.now(), target_s=5.0, roll_forward=True, forward_pending=True,
                         from_generation=split.generation, status="running" if owed == "running" else "failed")

    apply_retention(keep=3)

    assert statuses(three_versions)[2] == "ready"
    assert storage.exists(ModelVersion.objects.get(model=three_versions, number=2).sha256)


def test_the_canary_of_a_paused_rollout_keeps_its_artifact(three_versions, settings, operator):
    """A rollout paused by a rollback is resumed to its step again: its canary archived
    meanwhile made the resume a 400 ("version 6 is archived")."""
    settings.RETENTION_ROLLBACK_DEPTH = 1
    add_versions(three_versions, [10, 11, 12])
    rollout = rollouts.start(three_versions, 2, [10, 50, 100], 0, {}, operator)
    releases.rollback(three_versions, operator)
    rollout.refresh_from_db()
    assert rollout.status == "paused"

    apply_retention(keep=3)

    assert statuses(three_versions)[2] == "ready"
