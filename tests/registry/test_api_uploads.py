"""Uploading versions through the REST API: answered at once (202, validating), then
ready with its report once the validation job ran; what is cheap to refuse is refused at
once with nothing left."""

from __future__ import annotations

import hashlib
import io

import pytest
from django.test import Client

from registry.actions import releases
from registry.building.onnx_build import random_mlp
from registry.models import AuditEvent, Job, ModelVersion, RegisteredModel, Release
from tests.fixtures.jobs import validated
from tests.fixtures.onnx_files import write_model
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db


@pytest.fixture
def model(operator) -> RegisteredModel:
    return RegisteredModel.objects.create(name="digits", description="demo", created_by=operator)


def upload(client, path, name="digits", **extra):
    with open(path, "rb") as handle:
        return client.post(f"/api/models/{name}/versions/", {"artifact": handle, **extra}, format="multipart")


def upload_validated(client, path, name="digits", **extra) -> dict:
    """Upload, run the validation job, and return the version as the API shows it then."""
    return validated(client, upload(client, path, name, **extra))


def test_upload_registers_a_version_ready_with_its_signature_once_validated(operator_client, model, good_onnx):
    body = upload_validated(operator_client, good_onnx, description="first")

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
    upload_validated(operator_client, good_onnx)

    release = Release.objects.get(model=model)
    assert release.routes == [{"version": 1, "weight": 100}]
    assert release.stable_version == 1
    detail = operator_client.get("/api/models/digits/").json()
    assert detail["current_release"]["routes"] == [{"version": 1, "weight": 100}]


def test_second_version_does_not_change_traffic(operator_client, model, good_onnx, good_onnx_v2):
    upload_validated(operator_client, good_onnx)
    second = upload_validated(operator_client, good_onnx_v2)

    assert (second["number"], second["status"]) == (2, "ready")
    assert list(Release.objects.filter(model=model).values_list("routes", flat=True)) == [[{"version": 1, "weight": 100}]]


def test_same_bytes_twice_are_stored_once(operator_client, model, good_onnx, artifact_root):
    first = upload_validated(operator_client, good_onnx)
    second = upload_validated(operator_client, good_onnx, allow_duplicate="true")

    assert (first["number"], second["number"]) == (1, 2)
    assert first["sha256"] == second["sha256"]
    assert [path.name for path in stored_files(artifact_root)] == [first["sha256"]]


def test_artifact_download_returns_the_bytes_and_their_sha256(operator_client, model, good_onnx):
    upload_validated(operator_client, good_onnx)

    response = operator_client.get("/api/models/digits/versions/1/artifact")

    assert response.status_code == 200
    content = b"".join(response.streaming_content)
    assert content == good_onnx.read_bytes()
    assert response["X-Artifact-SHA256"] == hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize(
    ("fixture_name", "words"),
    [
        ("truncated_onnx", "not an ONNX model: it is cut short"),
        ("random_bytes_file", "not an ONNX model"),
        ("empty_file", "empty"),
    ],
)
def test_an_upload_cheap_to_refuse_is_refused_at_once_naming_the_problem_and_leaves_nothing(request, operator_client, model, artifact_root, fixture_name, words):
    path = request.getfixturevalue(fixture_name)

    response = upload(operator_client, path)

    assert response.status_code == 400, response.content
    assert words.lower() in response.json()["error"].lower()
    assert ModelVersion.objects.count() == 0
    assert Job.objects.count() == 0
    assert Release.objects.count() == 0
    assert stored_files(artifact_root) == []
    assert AuditEvent.objects.filter(kind="upload_refused").count() == 1


@pytest.mark.parametrize(
    ("fixture_name", "words"),
    [
        ("external_data_onnx", "external data"),
        ("unknown_domain_onnx", "com.example.evil"),
        ("checker_failing_onnx", "checker"),
        ("ort_format_onnx", "would read it as its ORT format"),
    ],
)
def test_an_upload_failing_inspection_is_rejected_with_its_report_and_keeps_no_artifact(request, operator_client, model, artifact_root, fixture_name, words):
    path = request.getfixturevalue(fixture_name)

    body = upload_validated(operator_client, path)

    assert (body["number"], body["status"]) == (1, "rejected")
    assert words.lower() in body["status_reason"].lower()
    assert body["validation_report"]["refused"] == body["status_reason"]
    assert body["artifact_url"] is None
    assert Release.objects.count() == 0
    assert stored_files(artifact_root) == []
    assert AuditEvent.objects.filter(kind="upload_refused").count() == 1


def test_upload_over_the_size_limit_is_refused_with_413(settings, operator_client, model, good_onnx, artifact_root):
    settings.MAX_UPLOAD_BYTES = good_onnx.stat().st_size - 1

    response = upload(operator_client, good_onnx)

    assert response.status_code == 413
    assert "larger than the limit" in response.json()["error"]
    assert ModelVersion.objects.count() == 0
    assert Job.objects.count() == 0
    assert stored_files(artifact_root) == []


def refused_uploads() -> list[tuple[str, str]]:
    return list(AuditEvent.objects.filter(kind="upload_refused").values_list("actor__username", "message"))


def test_an_upload_over_the_size_limit_is_recorded_as_refused_like_the_other_cheap_refusals(settings, operator_client, model, good_onnx):
    settings.MAX_UPLOAD_BYTES = good_onnx.stat().st_size - 1

    upload(operator_client, good_onnx)

    assert refused_uploads() == [("olivia", f"Upload refused: the artifact is larger than the limit of {settings.MAX_UPLOAD_BYTES} bytes "
                                            "(MAX_UPLOAD_BYTES)")]


@pytest.mark.parametrize("content_type", ["application/octet-stream", "application/json"])
def test_an_upload_that_is_not_a_form_says_to_send_one(operator_client, model, good_onnx, content_type):
    # A newcomer sending the raw bytes was told only what they had sent.
    response = operator_client.post("/api/models/digits/versions/", good_onnx.read_bytes(), content_type=content_type)

    assert response.status_code == 415
    assert response.json()["error"] == (f'Unsupported media type "{content_type}" in request. This endpoint takes multipart/form-data '
                                        "(the file in a form field, as curl -F sends it).")
    assert ModelVersion.objects.count() == 0


def test_upload_without_a_file_names_the_missing_field(operator_client, model):
    response = operator_client.post("/api/models/digits/versions/", {"description": "x"}, format="multipart")

    assert response.status_code == 400
    assert "artifact" in response.json()["error"]
    assert ModelVersion.objects.count() == 0


def test_an_upload_with_a_field_it_does_not_take_is_refused_naming_it_and_leaves_nothing(operator_client, model, good_onnx, artifact_root):
    response = upload(operator_client, good_onnx, descriptoin="typo")

    assert response.status_code == 400
    assert response.json()["error"] == ("descriptoin: this request does not take this field "
                                        "(it takes: artifact, description, allow_duplicate)")
    assert ModelVersion.objects.count() == 0
    assert stored_files(artifact_root) == []


def test_an_upload_of_two_files_is_refused_not_one_of_them_kept(operator_client, model, good_onnx, good_onnx_v2, artifact_root):
    with open(good_onnx, "rb") as first, open(good_onnx_v2, "rb") as second:
        response = operator_client.post("/api/models/digits/versions/", {"artifact": [first, second]}, format="multipart")

    assert response.status_code == 400
    assert response.json()["error"] == "artifact: given 2 times: send it once"
    assert ModelVersion.objects.count() == 0
    assert stored_files(artifact_root) == []


def test_a_description_past_2000_characters_is_refused_as_the_console_form_refuses_it(operator_client, model, good_onnx, artifact_root):
    response = upload(operator_client, good_onnx, description="x" * 2001)

    assert response.status_code == 400
    assert response.json()["error"] == "description: Ensure this field has no more than 2000 characters."
    assert ModelVersion.objects.count() == 0


@pytest.mark.parametrize(("extra", "words"), [
    ({f"field{index}": "x" for index in range(1001)}, "DATA_UPLOAD_MAX_NUMBER_FIELDS"),
    ({"more": [io.BytesIO(b"x") for _ in range(101)]}, "DATA_UPLOAD_MAX_NUMBER_FILES"),
], ids=["fields", "files"])
def test_an_upload_past_django_s_count_of_fields_or_files_is_a_json_400_naming_the_limit(operator_client, model, good_onnx, artifact_root,
                                                                                        extra, words):
    response = upload(operator_client, good_onnx, **extra)

    assert response.status_code == 400
    assert words in response.json()["error"]
    assert ModelVersion.objects.count() == 0 and stored_files(artifact_root) == []


def test_the_upload_answer_gives_its_validation_job_one_status(operator_client, model, good_onnx, monkeypatch):
    # The version's validation_job was read after the job had moved on, the job itself
    # before: the same 202 said "running" and "queued" (2 of 6 uploads in an audit).
    from registry.api import versions_views
    from registry.models import Job

    def a_celery_worker_starts_the_job_meanwhile(request, words):
        Job.objects.filter(model=model).update(status="running")

    monkeypatch.setattr(versions_views, "mark_committed", a_celery_worker_starts_the_job_meanwhile)

    body = upload(operator_client, good_onnx).json()

    assert body["validation_job"]["id"] == body["job"]["id"]
    assert body["validation_job"]["status"] == body["job"]["status"] == "running"


def test_upload_to_an_unknown_model_is_404(operator_client, good_onnx, artifact_root):
    response = upload(operator_client, good_onnx, name="nope")

    assert response.status_code == 404
    assert response.json()["error"]
    assert stored_files(artifact_root) == []


def test_viewer_cannot_upload(viewer_client, model, good_onnx, artifact_root):
    response = upload(viewer_client, good_onnx)

    assert response.status_code == 403
    assert ModelVersion.objects.count() == 0
    assert Job.objects.count() == 0
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
    body = upload_validated(operator_client, good_onnx)

    assert body["validation_report"]["compatibility"] == {"stable_version": None, "compatible": True, "differences": [], "notes": []}


def test_a_version_with_the_stable_inputs_is_reported_compatible(operator_client, model, good_onnx, sixty_four_inputs_onnx):
    upload_validated(operator_client, good_onnx)

    body = upload_validated(operator_client, sixty_four_inputs_onnx)

    assert body["validation_report"]["compatibility"] == {"stable_version": 1, "compatible": True, "differences": [], "notes": []}


def test_a_version_with_other_inputs_is_registered_but_reported_incompatible(operator_client, model, good_onnx, sixty_inputs_onnx):
    upload_validated(operator_client, good_onnx)

    body = upload_validated(operator_client, sixty_inputs_onnx)

    assert body["status"] == "ready"
    compatibility = body["validation_report"]["compatibility"]
    assert compatibility["stable_version"] == 1
    assert compatibility["compatible"] is False
    assert compatibility["differences"] == ["input 'input' dimension 1: 64 on v1, 60 here"]
    assert ModelVersion.objects.get(model=model, number=2).validation_report["compatibility"] == compatibility


def test_compatibility_is_judged_against_the_current_stable(operator_client, operator, model, good_onnx, sixty_inputs_onnx, sixty_four_inputs_onnx):
    upload_validated(operator_client, good_onnx)
    upload_validated(operator_client, sixty_inputs_onnx)
    releases.set_routes(model, [{"version": 2, "weight": 100}], operator, "a test of the stable's change", force=True)  # v2 (60 inputs) is stable now

    compatibility = upload_validated(operator_client, sixty_four_inputs_onnx)["validation_report"]["compatibility"]

    assert compatibility["stable_version"] == 2
    assert compatibility["differences"] == ["input 'input' dimension 1: 60 on v2, 64 here"]


def test_the_upload_audit_event_says_whether_the_version_is_compatible(operator_client, model, good_onnx, sixty_inputs_onnx, sixty_four_inputs_onnx):
    upload_validated(operator_client, good_onnx)
    upload_validated(operator_client, sixty_four_inputs_onnx)
    upload_validated(operator_client, sixty_inputs_onnx)

    messages = dict(AuditEvent.objects.filter(kind="version_uploaded").values_list("data__version", "message"))
    assert "compatible" not in messages[1]
    assert messages[2].endswith("; compatible with stable v1")
    assert messages[3].endswith("; incompatible with stable v1: input 'input' dimension 1: 64 on v1, 60 here")


def test_the_version_page_shows_an_incompatible_version_and_its_differences(operator, operator_client, model, good_onnx, sixty_inputs_onnx):
    upload_validated(operator_client, good_onnx)
    upload_validated(operator_client, sixty_inputs_onnx)
    page = Client()
    page.force_login(operator)

    html = page.get("/models/digits/versions/2/").content.decode()

    assert "Incompatible with stable v1" in html
    assert "<li>input &#x27;input&#x27; dimension 1: 64 on v1, 60 here</li>" in html
    assert "Compatible with stable" not in html
    assert "stable_version" not in html  # the report's facts table does not repeat it raw


def test_the_version_page_shows_a_compatible_version(operator, operator_client, model, good_onnx, sixty_four_inputs_onnx):
    upload_validated(operator_client, good_onnx)
    upload_validated(operator_client, sixty_four_inputs_onnx)
    page = Client()
    page.force_login(operator)

    html = page.get("/models/digits/versions/2/").content.decode()

    assert "Compatible with stable v1" in html
    assert "Incompatible" not in html
    assert "Compatible with stable" not in page.get("/models/digits/versions/1/").content.decode()


def test_a_description_with_a_directional_override_is_refused_and_stores_nothing(operator_client, model, good_onnx, artifact_root):
    response = upload(operator_client, good_onnx, description="\x1b[2J\u202ePWNED")

    assert response.status_code == 400
    assert response.json()["error"] == ("description: must not hold control characters or directional overrides (found U+001B)")
    assert ModelVersion.objects.count() == 0
    assert stored_files(artifact_root) == []
