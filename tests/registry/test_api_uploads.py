"""Uploading versions through the REST API: accepted whole, or refused with nothing left."""

from __future__ import annotations

import hashlib

import pytest

from registry.models import AuditEvent, ModelVersion, RegisteredModel, Release
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db


@pytest.fixture
def model(operator) -> RegisteredModel:
    return RegisteredModel.objects.create(name="digits", description="demo", created_by=operator)


def upload(client, path, name="digits", **extra):
    with open(path, "rb") as handle:
        return client.post(f"/api/models/{name}/versions/", {"artifact": handle, **extra}, format="multipart")


def test_upload_registers_a_ready_version_with_its_signature(operator_client, model, good_onnx):
    response = upload(operator_client, good_onnx, description="first")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["number"] == 1
    assert body["status"] == "ready"
    assert body["description"] == "first"
    assert body["sha256"] == hashlib.sha256(good_onnx.read_bytes()).hexdigest()
    assert body["size_bytes"] == good_onnx.stat().st_size
    assert body["signature"]["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["batch", 64]}]
    assert body["signature"]["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": ["batch", 10]}]
    assert body["opset"] == 17
    assert body["uploaded_by"] == "olivia"
    assert body["validation_report"]


def test_first_ready_version_becomes_stable_at_full_weight(operator_client, model, good_onnx):
    upload(operator_client, good_onnx)

    release = Release.objects.get(model=model)
    assert release.routes == [{"version": 1, "weight": 100}]
    assert release.stable_version == 1
    detail = operator_client.get("/api/models/digits/").json()
    assert detail["current_release"]["routes"] == [{"version": 1, "weight": 100}]


def test_second_version_does_not_change_traffic(operator_client, model, good_onnx, good_onnx_v2):
    upload(operator_client, good_onnx)
    response = upload(operator_client, good_onnx_v2)

    assert response.json()["number"] == 2
    assert list(Release.objects.filter(model=model).values_list("routes", flat=True)) == [[{"version": 1, "weight": 100}]]


def test_same_bytes_twice_are_stored_once(operator_client, model, good_onnx, artifact_root):
    first = upload(operator_client, good_onnx).json()
    second = upload(operator_client, good_onnx).json()

    assert (first["number"], second["number"]) == (1, 2)
    assert first["sha256"] == second["sha256"]
    assert [path.name for path in stored_files(artifact_root)] == [first["sha256"]]


def test_artifact_download_returns_the_bytes_and_their_sha256(operator_client, model, good_onnx):
    upload(operator_client, good_onnx)

    response = operator_client.get("/api/models/digits/versions/1/artifact")

    assert response.status_code == 200
    content = b"".join(response.streaming_content)
    assert content == good_onnx.read_bytes()
    assert response["X-Artifact-SHA256"] == hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize(
    ("fixture_name", "status", "words"),
    [
        ("truncated_onnx", 400, "not an ONNX model"),
        ("random_bytes_file", 400, "not an ONNX model"),
        ("empty_file", 400, "empty"),
        ("external_data_onnx", 422, "external data"),
        ("unknown_domain_onnx", 422, "com.example.evil"),
        ("checker_failing_onnx", 422, "checker"),
    ],
)
def test_refused_upload_names_the_problem_and_leaves_nothing(request, operator_client, model, artifact_root, fixture_name, status, words):
    path = request.getfixturevalue(fixture_name)

    response = upload(operator_client, path)

    assert response.status_code == status, response.content
    assert words.lower() in response.json()["error"].lower()
    assert ModelVersion.objects.count() == 0
    assert Release.objects.count() == 0
    assert stored_files(artifact_root) == []
    assert AuditEvent.objects.filter(kind="upload_refused").count() == 1


def test_upload_over_the_size_limit_is_refused_with_413(settings, operator_client, model, good_onnx, artifact_root):
    settings.MAX_UPLOAD_BYTES = good_onnx.stat().st_size - 1

    response = upload(operator_client, good_onnx)

    assert response.status_code == 413
    assert "larger than the limit" in response.json()["error"]
    assert ModelVersion.objects.count() == 0
    assert stored_files(artifact_root) == []


def test_upload_without_a_file_names_the_missing_field(operator_client, model):
    response = operator_client.post("/api/models/digits/versions/", {"description": "x"}, format="multipart")

    assert response.status_code == 400
    assert "artifact" in response.json()["error"]
    assert ModelVersion.objects.count() == 0


def test_upload_to_an_unknown_model_is_404(operator_client, good_onnx, artifact_root):
    response = upload(operator_client, good_onnx, name="nope")

    assert response.status_code == 404
    assert response.json()["error"]
    assert stored_files(artifact_root) == []


def test_viewer_cannot_upload(viewer_client, model, good_onnx, artifact_root):
    response = upload(viewer_client, good_onnx)

    assert response.status_code == 403
    assert ModelVersion.objects.count() == 0
    assert stored_files(artifact_root) == []
