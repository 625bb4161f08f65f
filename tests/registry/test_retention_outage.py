"""A retention run that a database outage stops midway leaves no artifact behind: a file
whose version was archived is deleted by a later run, while the files of routed versions
and rollback targets stay (registry/actions/retention.py)."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import OperationalError, connection

from registry import tasks
from registry.actions import releases, uploads
from registry.artifacts import storage
from registry.building.onnx_build import random_mlp, to_bytes
from registry.models import ModelVersion, RegisteredModel

pytestmark = pytest.mark.django_db

OUTAGE = OperationalError("server closed the connection unexpectedly")


def add_versions(model, seeds):
    return [uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([8, 4], seed=seed))), uploaded_by=None) for seed in seeds]


def version(model, number) -> ModelVersion:
    return ModelVersion.objects.get(model=model, number=number)


def statuses(model):
    return dict(model.versions.values_list("number", "status"))


def kept(model) -> dict[int, bool]:
    return {v.number: storage.exists(v.sha256) for v in model.versions.order_by("number")}


@pytest.fixture
def two_models(three_versions, settings):
    """``digits`` v1..v4, v4 routed, v1 its rollback target (v2, v3 may go); then ``other``
    v1..v3, v1 routed (v2 may go). Retention keeps one version and one rollback."""
    settings.RETENTION_KEEP_VERSIONS = 1
    settings.RETENTION_ROLLBACK_DEPTH = 1
    add_versions(three_versions, [10])
    releases.set_routes(three_versions, [{"version": 4, "weight": 100}], AnonymousUser())
    other = RegisteredModel.objects.create(name="other")
    add_versions(other, [20, 21, 22])
    assert RegisteredModel.objects.filter(name="other").get().pk > three_versions.pk  # handled second
    return three_versions, other


def outage_on(condition):
    def wrapper(execute, sql, params, many, context):
        if condition(sql, params):
            raise OUTAGE
        return execute(sql, params, many, context)
    return connection.execute_wrapper(wrapper)


def archiving(target: ModelVersion):
    """The database goes while the run archives ``target`` (its model's transaction rolls back)."""
    return outage_on(lambda sql, params: sql.startswith('UPDATE "registry_modelversion"') and target.pk in (params or ()))


def checking_files():
    """The database goes when the run asks whether a file is still needed, before deleting it."""
    return outage_on(lambda sql, params: '"registry_modelversion"."sha256" =' in sql)


def test_files_archived_before_an_outage_stopped_the_run_are_deleted_by_the_next_run(two_models, caplog):
    digits, other = two_models
    with archiving(version(other, 2)):
        assert tasks.apply_retention() is None  # skipped with one warning
    assert "apply_retention skipped: the database is unavailable" in caplog.text
    assert statuses(digits) == {1: "ready", 2: "archived", 3: "archived", 4: "ready"}
    assert statuses(other) == {1: "ready", 2: "ready", 3: "ready"}

    assert tasks.apply_retention() == 1  # the database is back

    assert statuses(other) == {1: "ready", 2: "archived", 3: "ready"}
    assert kept(digits) == {1: True, 2: False, 3: False, 4: True}  # v4 routed, v1 the rollback target
    assert kept(other) == {1: True, 2: False, 3: True}


def test_files_an_outage_kept_the_run_from_deleting_are_deleted_by_the_next_run(two_models):
    digits, other = two_models
    with checking_files():
        assert tasks.apply_retention() is None
    assert statuses(digits) == {1: "ready", 2: "archived", 3: "archived", 4: "ready"}
    assert kept(digits) == {1: True, 2: True, 3: True, 4: True}  # nothing deleted yet

    tasks.apply_retention()

    assert kept(digits) == {1: True, 2: False, 3: False, 4: True}
    assert kept(other) == {1: True, 2: False, 3: True}


def test_a_left_file_that_another_ready_version_shares_stays(two_models):
    digits, other = two_models
    with checking_files():
        tasks.apply_retention()
    shared = add_versions(other, [1])[0]  # other v4: the bytes of the archived digits v2
    assert shared.sha256 == version(digits, 2).sha256

    tasks.apply_retention()

    assert kept(digits) == {1: True, 2: True, 3: False, 4: True}
    assert storage.exists(shared.sha256)


def test_a_left_file_of_a_version_a_rollback_reaches_again_stays(three_versions, settings):
    settings.RETENTION_KEEP_VERSIONS = 1
    settings.RETENTION_ROLLBACK_DEPTH = 1
    add_versions(three_versions, [10])
    for number in (2, 3, 4):
        releases.set_routes(three_versions, [{"version": number, "weight": 100}], AnonymousUser())
    with checking_files():
        tasks.apply_retention()
    assert statuses(three_versions) == {1: "archived", 2: "archived", 3: "ready", 4: "ready"}
    releases.rollback(three_versions, AnonymousUser())  # to v3, whose own rollback target routes the archived v2

    tasks.apply_retention()

    assert kept(three_versions) == {1: False, 2: True, 3: True, 4: True}


def test_a_left_file_whose_bytes_are_uploaded_again_stays_while_the_new_row_is_not_yet_committed(two_models):
    digits, other = two_models
    with checking_files():
        tasks.apply_retention()
    left = version(digits, 2)
    assert storage.exists(left.sha256)
    staged = storage.stage_stream(io.BytesIO(storage.path_for(left.sha256).read_bytes()))
    storage.commit(staged)  # an upload of the same bytes, its version row not committed yet

    tasks.apply_retention()

    assert storage.exists(left.sha256)
