"""An upload whose bytes equal an existing version's of the same model is answered 409,
naming that version, and leaves nothing behind; ``allow_duplicate=true`` registers a copy."""

from __future__ import annotations

import pytest

from registry.models import AuditEvent, Job, ModelVersion, RegisteredModel
from tests.fixtures.jobs import validated
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db


@pytest.fixture
def model(operator) -> RegisteredModel:
    return RegisteredModel.objects.create(name="digits", created_by=operator)


def upload(client, path, name="digits", **extra):
    with open(path, "rb") as handle:
        return client.post(f"/api/models/{name}/versions/", {"artifact": handle, **extra}, format="multipart")


def test_identical_upload_is_a_409_naming_the_existing_version(operator_client, model, good_onnx):
    validated(operator_client, upload(operator_client, good_onnx))

    response = upload(operator_client, good_onnx)

    assert response.status_code == 409, response.content
    body = response.json()
    assert "identical to version 1" in body["error"]
    assert body["existing_version"] == 1
    assert body["url"] == "/api/models/digits/versions/1/"
    assert body["page_url"] == "/models/digits/versions/1/"


def test_identical_upload_leaves_no_row_no_job_no_event_and_no_extra_file(operator_client, model, good_onnx, artifact_root):
    first = validated(operator_client, upload(operator_client, good_onnx))
    events_before, jobs_before = AuditEvent.objects.count(), Job.objects.count()

    upload(operator_client, good_onnx)

    assert list(ModelVersion.objects.values_list("number", flat=True)) == [1]
    assert (AuditEvent.objects.count(), Job.objects.count()) == (events_before, jobs_before)
    assert [path.name for path in stored_files(artifact_root)] == [first["sha256"]]


def test_identical_to_a_rejected_version_is_refused_and_its_bytes_are_not_kept(operator_client, model, external_data_onnx, artifact_root):
    rejected = validated(operator_client, upload(operator_client, external_data_onnx))
    assert rejected["status"] == "rejected"

    response = upload(operator_client, external_data_onnx)

    assert response.status_code == 409
    assert "(rejected" in response.json()["error"]
    assert stored_files(artifact_root) == []


def test_allow_duplicate_registers_a_new_version_of_the_same_bytes(operator_client, model, good_onnx):
    first = validated(operator_client, upload(operator_client, good_onnx))

    copy = validated(operator_client, upload(operator_client, good_onnx, allow_duplicate="true"))

    assert (copy["number"], copy["status"], copy["sha256"]) == (2, "ready", first["sha256"])


def test_the_same_bytes_for_another_model_are_not_a_duplicate(operator_client, model, good_onnx):
    RegisteredModel.objects.create(name="other")
    validated(operator_client, upload(operator_client, good_onnx))

    response = upload(operator_client, good_onnx, name="other")

    assert response.status_code == 202


def test_upload_to_an_archived_model_is_a_409_leaving_nothing(operator_client, model, good_onnx, artifact_root):
    operator_client.post("/api/models/digits/archive/", {}, format="json")

    response = upload(operator_client, good_onnx)

    assert response.status_code == 409
    assert "archived" in response.json()["error"]
    assert ModelVersion.objects.count() == 0
    assert stored_files(artifact_root) == []

