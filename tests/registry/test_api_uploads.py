"""Uploading versions through the REST API: accepted whole, or refused with nothing left."""

from __future__ import annotations

import hashlib

import pytest
from django.test import Client

from registry.actions import releases
from registry.building.onnx_build import random_mlp
from registry.models import AuditEvent, ModelVersion, RegisteredModel, Release
from tests.fixtures.onnx_files import write_model
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


# ---------------------------------------------------------------- compatibility with the stable version


@pytest.fixture
def sixty_inputs_onnx(tmp_path):
    """Takes 60 features where good_onnx takes 64: a valid model clients of v1 cannot call."""
    return write_model(tmp_path, "sixty.onnx", random_mlp([60, 10], seed=2))


@pytest.fixture
def sixty_four_inputs_onnx(tmp_path):
    """Another architecture with good_onnx's inputs and outputs."""
    return write_model(tmp_path, "sixty_four.onnx", random_mlp([64, 10], seed=2))


def test_a_first_version_has_no_stable_to_be_compatible_with(operator_client, model, good_onnx):
    body = upload(operator_client, good_onnx).json()

    assert body["validation_report"]["compatibility"] == {"stable_version": None, "compatible": True, "differences": [], "notes": []}


def test_a_version_with_the_stable_inputs_is_reported_compatible(operator_client, model, good_onnx, sixty_four_inputs_onnx):
    upload(operator_client, good_onnx)

    body = upload(operator_client, sixty_four_inputs_onnx).json()

    assert body["validation_report"]["compatibility"] == {"stable_version": 1, "compatible": True, "differences": [], "notes": []}


def test_a_version_with_other_inputs_is_registered_but_reported_incompatible(operator_client, model, good_onnx, sixty_inputs_onnx):
    upload(operator_client, good_onnx)

    response = upload(operator_client, sixty_inputs_onnx)

    assert response.status_code == 201, response.content
    compatibility = response.json()["validation_report"]["compatibility"]
    assert compatibility["stable_version"] == 1
    assert compatibility["compatible"] is False
    assert compatibility["differences"] == ["input 'input' dimension 1: 64 on v1, 60 here"]
    assert ModelVersion.objects.get(model=model, number=2).validation_report["compatibility"] == compatibility


def test_compatibility_is_judged_against_the_current_stable(operator_client, operator, model, good_onnx, sixty_inputs_onnx, sixty_four_inputs_onnx):
    upload(operator_client, good_onnx)
    upload(operator_client, sixty_inputs_onnx)
    releases.set_routes(model, [{"version": 2, "weight": 100}], operator, "a test of the stable's change", force=True)  # v2 (60 inputs) is stable now

    compatibility = upload(operator_client, sixty_four_inputs_onnx).json()["validation_report"]["compatibility"]

    assert compatibility["stable_version"] == 2
    assert compatibility["differences"] == ["input 'input' dimension 1: 60 on v2, 64 here"]


def test_the_upload_audit_event_says_whether_the_version_is_compatible(operator_client, model, good_onnx, sixty_inputs_onnx, sixty_four_inputs_onnx):
    upload(operator_client, good_onnx)
    upload(operator_client, sixty_four_inputs_onnx)
    upload(operator_client, sixty_inputs_onnx)

    messages = dict(AuditEvent.objects.filter(kind="version_uploaded").values_list("data__version", "message"))
    assert "compatible" not in messages[1]
    assert messages[2].endswith("; compatible with stable v1")
    assert messages[3].endswith("; incompatible with stable v1: input 'input' dimension 1: 64 on v1, 60 here")


def test_the_version_page_shows_an_incompatible_version_and_its_differences(operator, operator_client, model, good_onnx, sixty_inputs_onnx):
    upload(operator_client, good_onnx)
    upload(operator_client, sixty_inputs_onnx)
    page = Client()
    page.force_login(operator)

    html = page.get("/models/digits/versions/2/").content.decode()

    assert "Incompatible with stable v1" in html
    assert "<li>input &#x27;input&#x27; dimension 1: 64 on v1, 60 here</li>" in html
    assert "Compatible with stable" not in html
    assert "stable_version" not in html  # the report's facts table does not repeat it raw


def test_the_version_page_shows_a_compatible_version(operator, operator_client, model, good_onnx, sixty_four_inputs_onnx):
    upload(operator_client, good_onnx)
    upload(operator_client, sixty_four_inputs_onnx)
    page = Client()
    page.force_login(operator)

    html = page.get("/models/digits/versions/2/").content.decode()

    assert "Compatible with stable v1" in html
    assert "Incompatible" not in html
    assert "Compatible with stable" not in page.get("/models/digits/versions/1/").content.decode()
