"""The release functions' promises, each with exact expectations: who acted, what each
action routes and what a later rollback returns to, that a restore stays inside its
model, and that the desired state is published once after commit and never on refusal."""

from __future__ import annotations

import asyncio
import io

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.models import AnonymousUser

from registry.actions import drills, releases, uploads
from registry.building.onnx_build import random_mlp, to_bytes
from registry.domain.choices import AuditKind, ReleaseAction
from registry.models import AuditEvent, RegisteredModel, Release
from serving.contract import SERVING_GROUP

pytestmark = pytest.mark.django_db

RELEASE = "/api/models/digits/release/"
CANARY = [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]


def routes_of(release: Release) -> list[dict]:
    return release.routes


def chain(model: RegisteredModel) -> list[tuple]:
    """Every release of the model, oldest first: (generation, action, routes, stable, target generation)."""
    rows = model.releases.order_by("generation")
    return [(r.generation, r.action, r.routes, r.stable_version, r.rollback_target.generation if r.rollback_target else None) for r in rows]


def release_events(model: RegisteredModel) -> list[tuple]:
    events = AuditEvent.objects.filter(model=model, kind=AuditKind.RELEASE).order_by("pk")
    return [(event.data["generation"], event.data["action"], event.actor.username if event.actor else None) for event in events]


# ---- who acted -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "expected", "reason"),
    [
        (lambda model, actor: releases.set_routes(model, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], actor),
         ReleaseAction.SET_ROUTES, ""),
        (lambda model, actor: releases.promote(model, actor), ReleaseAction.PROMOTE, ""),
        (lambda model, actor: releases.rollback(model, actor), ReleaseAction.ROLLBACK, "rollback of generation 2, back to the routes of generation 1"),
        (lambda model, actor: releases.restore(model, 1, actor), ReleaseAction.RESTORE, "restore of generation 1"),
    ],
)
def test_every_traffic_change_records_who_made_it_on_the_release_and_the_audit_event(three_versions, operator, admin_user, action, expected, reason):
    releases.set_routes(three_versions, CANARY, operator)  # generation 2, by olivia

    release = action(three_versions, admin_user)

    assert (release.generation, release.action, release.actor, release.reason) == (3, expected, admin_user, reason)
    assert Release.objects.get(generation=3).actor == admin_user
    assert release_events(three_versions)[-2:] == [(2, "set_routes", "olivia"), (3, expected, "ada")]


def test_the_first_routed_version_records_its_uploader(three_versions):
    first = Release.objects.get(generation=1)

    assert (first.action, first.actor.username, first.reason) == (ReleaseAction.INITIAL, "olivia", "first ready version")
    assert release_events(three_versions) == [(1, "initial", "olivia")]


@pytest.mark.parametrize("actor", [None, AnonymousUser()])
def test_an_unauthenticated_actor_is_recorded_as_nobody(three_versions, actor):
    release = releases.set_routes(three_versions, CANARY, actor)

    assert Release.objects.get(pk=release.pk).actor is None
    assert release_events(three_versions)[-1] == (2, "set_routes", None)


def test_the_api_names_the_signed_in_operator_on_each_action(operator_client, three_versions):
    answers = [
        operator_client.post(RELEASE, {"routes": CANARY}, format="json"),
        operator_client.post(RELEASE + "promote/", {}, format="json"),
        operator_client.post(RELEASE + "rollback/", {}, format="json"),
        operator_client.post(RELEASE + "restore/", {"generation": 3}, format="json"),
    ]

    assert [(answer.status_code, answer.json()["release"]["action"], answer.json()["release"]["actor"]) for answer in answers] == [
        (201, "set_routes", "olivia"), (201, "promote", "olivia"), (201, "rollback", "olivia"), (201, "restore", "olivia"),
    ]
    assert [actor for _, _, actor in release_events(three_versions)] == ["olivia"] * 5


# ---- what each action routes, and what rollback returns to ------------------------------


def test_promote_routes_only_the_canary_and_rolls_back_to_the_last_all_stable_release(three_versions, operator):
    releases.set_routes(three_versions, CANARY, operator)

    promoted = releases.promote(three_versions, operator, "looks good")
    rolled_back = releases.rollback(three_versions, operator)

    assert (promoted.routes, promoted.stable_version, promoted.reason) == ([{"version": 2, "weight": 100}], 2, "looks good")
    # Not to the 90/10 split before the promote: that would leave a tenth of the traffic
    # on the version being rolled away from.
    assert (rolled_back.routes, rolled_back.stable_version) == ([{"version": 1, "weight": 100}], 1)
    assert rolled_back.reason == "rollback of generation 3, back to the routes of generation 1"


def test_rollback_after_a_restore_returns_to_what_the_restore_replaced(three_versions, operator):
    releases.set_routes(three_versions, CANARY, operator)  # 2
    releases.set_routes(three_versions, [{"version": 3, "weight": 100}], operator)  # 3
    releases.restore(three_versions, 2, operator)  # 4: the canary again, replacing 3
    releases.rollback(three_versions, operator)  # 5: back to 3
    releases.rollback(three_versions, operator)  # 6: back to what 3 replaced, 2

    assert chain(three_versions) == [
        (1, "initial", [{"version": 1, "weight": 100}], 1, None),
        (2, "set_routes", CANARY, 1, 1),
        (3, "set_routes", [{"version": 3, "weight": 100}], 3, 2),
        (4, "restore", CANARY, 1, 3),
        (5, "rollback", [{"version": 3, "weight": 100}], 3, 2),
        (6, "rollback", CANARY, 1, 1),
    ]
    assert Release.objects.get(generation=4).reason == "restore of generation 2"


def test_restoring_the_current_generation_is_refused_and_appends_nothing(three_versions, operator):
    # It used to append a copy, which became the rollback point: rollback then had nothing to return to.
    releases.set_routes(three_versions, CANARY, operator)

    with pytest.raises(releases.ReleaseConflict, match=r"^generation 2 routes what digits serves now \(v1 90%, v2 10%, generation 2\)"):
        releases.restore(three_versions, 2, operator, "re-publish")

    assert chain(three_versions) == [(1, "initial", [{"version": 1, "weight": 100}], 1, None), (2, "set_routes", CANARY, 1, 1)]


def test_a_drill_rolls_back_then_its_roll_forward_restores_the_generation_it_started_from(three_versions, operator):
    releases.set_routes(three_versions, CANARY, operator)  # 2

    drill = drills.run_drill(three_versions, operator, roll_forward=True)

    assert (drill.from_generation, drill.to_generation) == (2, 3)
    assert chain(three_versions)[2:] == [
        (3, "rollback", [{"version": 1, "weight": 100}], 1, None),
        (4, "restore", CANARY, 1, 3),
    ]
    assert Release.objects.get(generation=4).reason == f"roll forward after drill #{drill.pk}"
    assert releases.rollback(three_versions, operator).routes == [{"version": 1, "weight": 100}]


def test_a_split_keeps_the_current_stable_and_a_single_full_route_becomes_stable(three_versions, operator):
    releases.set_routes(three_versions, [{"version": 3, "weight": 100}], operator)

    split = releases.set_routes(three_versions, [{"version": 3, "weight": 60}, {"version": 2, "weight": 40}], operator)
    shadowed = releases.set_routes(three_versions, [{"version": 2, "weight": 100}, {"version": 1, "weight": 0, "shadow": 0.5}], operator)

    assert (split.stable_version, shadowed.stable_version) == (3, 2)
    assert shadowed.routes == [{"version": 2, "weight": 100}, {"version": 1, "weight": 0, "shadow": 0.5}]


def test_a_small_shadow_is_described_by_its_share_not_as_zero(three_versions, operator):
    releases.set_routes(three_versions, [{"version": 1, "weight": 100}, {"version": 3, "weight": 0, "shadow": 0.0049}], operator)

    message = AuditEvent.objects.filter(kind=AuditKind.RELEASE).order_by("pk").last().message

    assert message == "Traffic set to v1 100%, v3 shadow 0.49% (generation 2)"


def test_release_messages_describe_the_change(three_versions, operator):
    releases.set_routes(three_versions, CANARY + [{"version": 3, "weight": 0, "shadow": 0.25}], operator)
    releases.promote(three_versions, operator)
    releases.rollback(three_versions, operator)
    releases.restore(three_versions, 3, operator)

    messages = list(AuditEvent.objects.filter(kind=AuditKind.RELEASE).order_by("pk").values_list("message", flat=True))

    assert messages == [
        "Version 1 routed as stable at 100% (generation 1)",
        "Traffic set to v1 90%, v2 10%, v3 shadow 25% (generation 2)",
        "Version 2 promoted to stable at 100% (generation 3); a rollback returns to v1 100% (generation 1)",
        "Rolled back generation 3: traffic back to v1 100% (generation 4)",
        "Restored generation 3: traffic v2 100% (generation 5)",
    ]


# ---- refusals: the exact reason, nothing written ------------------------------------------


@pytest.fixture
def other_model(db, operator) -> RegisteredModel:
    """Model ``letters`` with one version, released after ``digits``: its generations are
    real generations, just not digits' ones."""
    model = RegisteredModel.objects.create(name="letters")
    uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([8, 4], seed=11))), uploaded_by=operator)
    return model


def test_restore_of_another_models_generation_is_refused_and_writes_nothing(operator_client, three_versions, other_model):
    foreign = other_model.current_release().generation  # 2: letters' first release
    before = (Release.objects.count(), AuditEvent.objects.count())

    response = operator_client.post(RELEASE + "restore/", {"generation": foreign}, format="json")

    assert (response.status_code, response.json()["error"]) == (400, f"model digits has no release with generation {foreign}")
    assert (Release.objects.count(), AuditEvent.objects.count()) == before
    assert three_versions.current_release().generation == 1


@pytest.mark.parametrize(
    ("attempt", "status", "message"),
    [
        (lambda model, actor: releases.promote(model, actor), 409, "nothing to promote: generation 1 routes only the stable version 1"),
        (lambda model, actor: releases.rollback(model, actor), 409, "nothing to roll back to: generation 1 is the first release of digits"),
        (lambda model, actor: releases.restore(model, 7, actor), 400, "model digits has no release with generation 7"),
        (lambda model, actor: releases.set_routes(model, [{"version": 2, "weight": 100}, {"version": 2, "weight": 0}], actor), 400, "version 2 appears twice in routes"),
        (
            lambda model, actor: releases.set_routes(model, [{"version": 2, "weight": 50}, {"version": 3, "weight": 50}], actor),
            400,
            "a canary needs a stable: a split must include the current stable (version 1) with a weight above 0",
        ),
    ],
)
def test_a_refused_change_names_the_reason_and_writes_nothing(three_versions, operator, attempt, status, message):
    before = (Release.objects.count(), AuditEvent.objects.count())

    with pytest.raises(releases.ReleaseError) as refused:
        attempt(three_versions, operator)

    assert (refused.value.status, refused.value.message) == (status, message)
    assert (Release.objects.count(), AuditEvent.objects.count()) == before


def test_a_split_on_a_model_without_a_release_needs_a_single_full_route(db):
    model = RegisteredModel.objects.create(name="empty")

    with pytest.raises(releases.ReleaseError) as refused:
        releases.set_routes(model, [{"version": 1, "weight": 100}], None)

    assert refused.value.message == "version 1 does not exist"
    with pytest.raises(releases.ReleaseConflict) as no_release:
        releases.promote(model, None)
    assert no_release.value.message == "model empty has no release yet: upload a version first"


def test_more_than_one_canary_cannot_be_promoted(three_versions, operator):
    releases.set_routes(three_versions, [{"version": 1, "weight": 80}, {"version": 2, "weight": 10}, {"version": 3, "weight": 10}], operator)

    with pytest.raises(releases.ReleaseConflict) as refused:
        releases.promote(three_versions, operator)

    assert refused.value.message == "more than one canary ([2, 3]); set the routes explicitly"


def test_rollback_to_routes_whose_version_was_archived_is_a_conflict(three_versions, operator):
    releases.set_routes(three_versions, [{"version": 2, "weight": 100}], operator)
    three_versions.versions.filter(number=1).update(status="archived")

    with pytest.raises(releases.ReleaseConflict) as refused:
        releases.rollback(three_versions, operator)

    assert refused.value.message == "v1 of digits is no longer ready (archived or rejected)"
    assert three_versions.current_release().generation == 2


# ---- publishing: once after commit, never on refusal ----------------------------------------


@pytest.fixture
def serving_group(settings):
    """An in-memory channel layer with one channel in the ``serving`` group; returns a
    function that takes every message the group received so far."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(SERVING_GROUP, channel)

    async def take_all() -> list[dict]:
        messages = []
        while True:
            try:
                messages.append(await asyncio.wait_for(layer.receive(channel), timeout=0.05))
            except asyncio.TimeoutError:
                return messages

    return async_to_sync(take_all)


@pytest.mark.parametrize(
    "change",
    [
        lambda model, actor: releases.set_routes(model, CANARY, actor),
        lambda model, actor: releases.rollback(model, actor),
        lambda model, actor: releases.restore(model, 1, actor),
    ],
)
def test_each_change_publishes_the_whole_state_once_after_commit(three_versions, operator, serving_group, django_capture_on_commit_callbacks, change):
    releases.set_routes(three_versions, [{"version": 2, "weight": 100}], operator)  # generation 2, not committed here
    serving_group()

    with django_capture_on_commit_callbacks(execute=False) as pending:
        release = change(three_versions, operator)
        assert serving_group() == []  # nothing leaves before the commit
    for callback in pending:
        callback()

    messages = serving_group()
    assert len(pending) == 1
    assert [(message["type"], message["state"]["generation"]) for message in messages] == [("serving.apply", 3)]
    assert messages[0]["state"]["models"]["digits"]["generation"] == release.generation
    assert [(r["version"], r["weight"]) for r in messages[0]["state"]["models"]["digits"]["routes"]] == [
        (route["version"], route["weight"]) for route in release.routes
    ]


@pytest.mark.parametrize(
    "refused",
    [
        lambda model, actor: releases.set_routes(model, [{"version": 9, "weight": 100}], actor),
        lambda model, actor: releases.promote(model, actor),
        lambda model, actor: releases.rollback(model, actor),
        lambda model, actor: releases.restore(model, 99, actor),
        lambda model, actor: releases.restore(model, 1, actor),  # what is served now
    ],
)
def test_a_refused_change_publishes_nothing(three_versions, operator, serving_group, django_capture_on_commit_callbacks, refused):
    serving_group()

    with django_capture_on_commit_callbacks(execute=True) as pending:
        with pytest.raises(releases.ReleaseError):
            refused(three_versions, operator)

    assert pending == []
    assert serving_group() == []


def test_a_publish_that_fails_is_logged_and_the_change_stands(three_versions, operator, settings, django_capture_on_commit_callbacks, caplog):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}}

    with django_capture_on_commit_callbacks(execute=True):
        release = releases.set_routes(three_versions, CANARY, operator)

    assert three_versions.current_release() == release
    assert "could not publish generation 2; workers will catch up on reconcile" in caplog.text


def test_the_fixture_gives_row_ids_unlike_version_numbers_and_generations(three_versions):
    """What keeps an id/number mix-up visible on SQLite (PostgreSQL shows it anyway)."""
    assert [version.pk == version.number for version in three_versions.versions.all()] == [False] * 3
    assert three_versions.current_release().pk != three_versions.current_release().generation


def unreleased_model() -> RegisteredModel:
    """A model with ready versions 1 and 2 but no release yet (rows written directly)."""
    from registry.models import ModelVersion

    model = RegisteredModel.objects.create(name="unreleased")
    for number in (1, 2):
        ModelVersion.objects.create(model=model, number=number, sha256=f"{number:064x}", size_bytes=1, status="ready")
    return model


def test_a_split_without_any_release_names_no_stable(db):
    model = unreleased_model()

    with pytest.raises(releases.ReleaseError) as refused:
        releases.set_routes(model, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], None)

    assert str(refused.value) == refused.value.message == (
        "a canary needs a stable: a split must include the current stable (none) with a weight above 0"
    )
    assert model.releases.count() == 0


def test_the_first_release_may_say_it_saw_generation_zero(db):
    model = unreleased_model()

    release = releases.set_routes(model, [{"version": 2, "weight": 100}], None, expected_generation=0)

    assert (release.stable_version, release.routes) == (2, [{"version": 2, "weight": 100}])


def test_a_conflict_on_a_model_without_a_release_says_so_in_every_field(db):
    model = unreleased_model()

    with pytest.raises(releases.GenerationConflict) as conflict:
        releases.set_routes(model, [{"version": 1, "weight": 100}], None, expected_generation=5)

    assert conflict.value.message == "unreleased has no release yet, but the request was made for generation 5: nothing changed"
    assert conflict.value.details() == {
        "expected_generation": 5, "current_generation": 0, "current_action": None, "current_actor": None, "current_at": None,
    }


def test_a_conflict_names_the_release_that_replaced_the_one_seen_in_every_field(three_versions, operator):
    releases.set_routes(three_versions, CANARY, operator)
    Release.objects.filter(generation=2).update(created_at="2026-01-02T03:04:05Z")
    current = Release.objects.get(generation=2)

    with pytest.raises(releases.GenerationConflict) as conflict:
        releases.rollback(three_versions, operator, expected_generation=1)

    assert conflict.value.message == (
        "generation 2 (traffic split changed by olivia at 03:04:05 UTC) replaced generation 1 you saw: nothing changed; reload and decide again"
    )
    assert conflict.value.details() == {
        "expected_generation": 1, "current_generation": 2, "current_action": "set_routes", "current_actor": "olivia",
        "current_at": current.created_at.isoformat(),
    }


def test_a_conflict_with_a_release_nobody_signed_leaves_the_actor_out(three_versions):
    Release.objects.filter(generation=1).update(actor=None, created_at="2026-01-02T03:04:05Z")

    with pytest.raises(releases.GenerationConflict) as conflict:
        releases.promote(three_versions, None, expected_generation=7)

    assert conflict.value.message == (
        "digits is at generation 1 (first version routed at 03:04:05 UTC), not generation 7 as the request says: "
        "nothing changed; reload and decide again"
    )
    assert conflict.value.details()["current_actor"] is None


def test_a_one_percent_canary_keeps_the_stable_and_can_be_promoted(three_versions, operator):
    split = releases.set_routes(three_versions, [{"version": 1, "weight": 99}, {"version": 2, "weight": 1}], operator)

    promoted = releases.promote(three_versions, operator)

    assert split.stable_version == 1
    assert (promoted.stable_version, promoted.routes) == (2, [{"version": 2, "weight": 100}])


def test_a_stable_left_at_one_percent_is_still_the_stable(three_versions, operator):
    flipped = releases.set_routes(three_versions, [{"version": 1, "weight": 1}, {"version": 2, "weight": 99}], operator)

    assert flipped.stable_version == 1
