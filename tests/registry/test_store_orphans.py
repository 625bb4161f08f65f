"""Retention deletes stored files that no version records once they have not been stored
for a day (STALE_UPLOAD_S): a console killed between storing an upload's bytes and
recording its version left one of up to MAX_UPLOAD_BYTES, for ever. A file a version
records stays, whatever its age; so does one an upload stored again within the day,
whose version may not be recorded yet.

What the kill leaves is made directly: bytes committed to the store (``storage.commit``,
as ``uploads.accept_staged`` does) and no row. Tests of what must stay also leave an old
unrecorded file beside it, which must go in the same run: without it, a sweep that never
ran would pass them.
"""

from __future__ import annotations

import io
import os
import time

import pytest

from registry.actions import events, uploads
from registry.actions.retention import STALE_UPLOAD_S, apply_retention
from registry.artifacts import storage
from registry.building.onnx_build import random_mlp, to_bytes
from registry.domain.choices import VersionStatus
from registry.models import ModelVersion

pytestmark = pytest.mark.django_db

DAY_OLD_S = STALE_UPLOAD_S + 3600


def stored(seed: int, age_s: float = DAY_OLD_S) -> str:
    """Bytes stored as an upload stores them, last stored ``age_s`` ago; their sha256."""
    staged = storage.stage_stream(io.BytesIO(to_bytes(random_mlp([8, 4], seed=seed))))
    storage.commit(staged)
    age(staged.sha256, age_s)
    return staged.sha256


def age(sha256: str, age_s: float, path=None) -> None:
    then = time.time() - age_s
    os.utime(path or storage.path_for(sha256), (then, then))


def aside(sha256: str):
    return storage.path_for(sha256).with_name(sha256 + storage.ASIDE_SUFFIX)


def test_retention_deletes_a_day_old_stored_file_no_version_records(three_versions):
    left_by_a_kill = stored(seed=50)

    apply_retention()

    assert not storage.exists(left_by_a_kill)
    assert not aside(left_by_a_kill).exists()
    assert all(storage.exists(version.sha256) for version in three_versions.versions.all())


def test_a_file_stored_within_the_day_stays_though_no_version_records_it_yet(three_versions):
    recording_now = stored(seed=50, age_s=STALE_UPLOAD_S - 3600)
    left_by_a_kill = stored(seed=51)

    apply_retention()

    assert storage.exists(recording_now)
    assert not storage.exists(left_by_a_kill)


def test_day_old_files_of_ready_and_validating_versions_stay(three_versions):
    validating = ModelVersion.objects.create(model=three_versions, number=4, sha256=stored(seed=52), size_bytes=1,
                                             status=VersionStatus.VALIDATING)
    for version in three_versions.versions.all():
        age(version.sha256, DAY_OLD_S)
    left_by_a_kill = stored(seed=51)

    apply_retention()

    assert all(storage.exists(version.sha256) for version in three_versions.versions.all())
    assert ModelVersion.objects.get(pk=validating.pk).status == VersionStatus.VALIDATING
    assert not storage.exists(left_by_a_kill)


def test_a_day_old_file_only_a_rejected_version_names_goes(three_versions):
    # mark_rejected deletes the file after its commit: a kill in between leaves it.
    rejected = ModelVersion.objects.create(model=three_versions, number=4, sha256=stored(seed=52), size_bytes=1,
                                           status=VersionStatus.REJECTED, status_reason="refused")

    apply_retention()

    assert not storage.exists(rejected.sha256)
    assert ModelVersion.objects.get(pk=rejected.pk).status == VersionStatus.REJECTED


def test_a_file_an_upload_stores_again_stays_until_its_version_is_recorded(three_versions):
    reused = stored(seed=50)
    left_by_a_kill = stored(seed=51)
    # An upload of the same bytes, its row not committed yet.
    storage.commit(storage.stage_stream(io.BytesIO(to_bytes(random_mlp([8, 4], seed=50)))))

    apply_retention()

    assert storage.exists(reused)
    assert not storage.exists(left_by_a_kill)


def test_a_version_recorded_while_the_sweep_runs_keeps_its_file(three_versions, monkeypatch):
    recorded_meanwhile = stored(seed=50)
    left_by_a_kill = stored(seed=51)
    delete_stale = storage.delete_stale

    def row_commits_first(sha256, cutoff_s, is_needed):
        if sha256 == recorded_meanwhile:  # listed as unrecorded; its version commits before the delete
            ModelVersion.objects.create(model=three_versions, number=4, sha256=sha256, size_bytes=1, status=VersionStatus.READY)
        return delete_stale(sha256, cutoff_s, is_needed)

    monkeypatch.setattr(storage, "delete_stale", row_commits_first)

    apply_retention()

    assert storage.exists(recorded_meanwhile)
    assert not aside(recorded_meanwhile).exists()
    assert not storage.exists(left_by_a_kill)


def test_an_upload_of_the_same_bytes_while_the_file_is_aside_keeps_a_copy_of_its_own():
    sha256 = stored(seed=50)
    same_bytes = to_bytes(random_mlp([8, 4], seed=50))
    uploads_seen = []

    def an_upload_arrives():  # asked with the file moved aside; the upload's row is not committed yet
        uploads_seen.append(storage.commit(storage.stage_stream(io.BytesIO(same_bytes))))
        return False

    deleted = storage.delete_stale(sha256, time.time() - STALE_UPLOAD_S, an_upload_arrives)

    assert (deleted, uploads_seen) == (True, [True])  # the old copy went; the upload stored its own
    assert storage.path_for(sha256).read_bytes() == same_bytes
    assert not aside(sha256).exists()


def test_a_file_a_killed_sweep_left_aside_is_deleted_by_the_next_run(three_versions):
    sha256 = stored(seed=50)
    os.replace(storage.path_for(sha256), aside(sha256))

    apply_retention()

    assert not aside(sha256).exists()
    assert not storage.exists(sha256)


def test_a_file_a_killed_sweep_left_aside_is_put_back_when_a_version_records_it(three_versions):
    sha256 = stored(seed=50)
    os.replace(storage.path_for(sha256), aside(sha256))
    ModelVersion.objects.create(model=three_versions, number=4, sha256=sha256, size_bytes=1, status=VersionStatus.READY)

    apply_retention()

    assert storage.exists(sha256)
    assert not aside(sha256).exists()


def test_a_rejected_version_s_file_stays_when_an_upload_stores_the_same_bytes_meanwhile(three_versions, operator, monkeypatch):
    # The rejection checked that no version had the bytes, then deleted them, while an
    # upload of the same bytes had stored them and not yet committed its row: that
    # version's file was gone, and its validation rejected it as "not in the store".
    model_bytes = to_bytes(random_mlp([8, 4], seed=60))
    version, _ = uploads.accept_staged(three_versions, storage.stage_stream(io.BytesIO(model_bytes)), uploaded_by=operator)
    age(version.sha256, DAY_OLD_S)
    rejected = events.version_rejected

    def and_the_same_bytes_uploaded_meanwhile(*args, **kwargs):
        rejected(*args, **kwargs)
        storage.commit(storage.stage_stream(io.BytesIO(model_bytes)))  # its row is not committed yet

    monkeypatch.setattr(events, "version_rejected", and_the_same_bytes_uploaded_meanwhile)

    uploads.mark_rejected(version, "refused for the test")

    assert storage.exists(version.sha256)


def test_a_rejected_version_s_file_goes_when_nothing_needs_it(three_versions, operator):
    version, _ = uploads.accept_staged(three_versions, storage.stage_stream(io.BytesIO(to_bytes(random_mlp([8, 4], seed=61)))),
                                       uploaded_by=operator)
    age(version.sha256, DAY_OLD_S)

    uploads.mark_rejected(version, "refused for the test")

    assert not storage.exists(version.sha256) and not aside(version.sha256).exists()
