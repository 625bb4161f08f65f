"""Validation off the request: an upload is answered 202 with a ``validating`` version and
its validation job; the job's inspection makes the version ``ready`` (routed first,
reported) or ``rejected`` (its report and reason kept, its artifact not); a job that
cannot run rejects the version saying why; nothing serves a version that is not ready."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from registry.actions import releases, retention, uploads
from registry.artifacts import storage
from registry.building.onnx_build import random_mlp, to_bytes
from registry.db_unavailable import LockWaitTimeout
from registry.domain.choices import JobKind, JobStatus
from registry.fleet.state import desired_state
from registry.jobs import records, runner, scheduling, validation
from registry.models import AuditEvent, Job, ModelVersion, RegisteredModel, Release
from tests.fixtures.jobs import run_queued_jobs
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db


@pytest.fixture
def model(operator) -> RegisteredModel:
    return RegisteredModel.objects.create(name="digits", created_by=operator)


def upload(client, path, name="digits", **fields):
    with open(path, "rb") as handle:
        return client.post(f"/api/models/{name}/versions/", {"artifact": handle, **fields}, format="multipart")


def version(number: int) -> ModelVersion:
    return ModelVersion.objects.get(model__name="digits", number=number)


@pytest.fixture
def ready_stable(operator_client, model, good_onnx) -> ModelVersion:
    """v1 uploaded and validated: ready, stable at 100%."""
    upload(operator_client, good_onnx)
    run_queued_jobs("validation")
    return version(1)


# ---------------------------------------------------------------- answered at once


def test_an_upload_is_answered_202_with_a_validating_version_and_its_queued_job(operator_client, model, good_onnx, artifact_root):
    response = upload(operator_client, good_onnx)

    assert response.status_code == 202, response.content
    body = response.json()
    job = Job.objects.get()
    assert (body["number"], body["status"], body["artifact_url"]) == (1, "validating", None)
    assert body["validation_job"] == {"id": job.pk, "status": "queued", "error": ""}
    assert (body["job"]["id"], body["job"]["kind"], body["job"]["status"], body["job"]["version"]) == (job.pk, "validation", "queued", 1)
    assert job.key == f"validation:{version(1).pk}"
    assert [path.name for path in stored_files(artifact_root)] == [body["sha256"]]  # the bytes wait in the store
    assert Release.objects.count() == 0  # not routed before it is judged


def test_the_version_takes_its_number_at_upload(operator_client, model, good_onnx, good_onnx_v2):
    first = upload(operator_client, good_onnx).json()
    second = upload(operator_client, good_onnx_v2).json()

    assert (first["number"], second["number"]) == (1, 2)
    assert list(ModelVersion.objects.values_list("status", flat=True)) == ["validating", "validating"]


# ---------------------------------------------------------------- the verdict


def test_after_its_validation_job_the_version_is_ready_with_its_report_and_routed_first(operator_client, model, good_onnx):
    upload(operator_client, good_onnx)

    (job,) = run_queued_jobs("validation")

    body = operator_client.get("/api/models/digits/versions/1/").json()
    assert (body["status"], body["status_reason"]) == ("ready", "")
    assert body["signature"]["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["batch", 64]}]
    assert body["opset"] == 17 and body["producer"]
    assert body["validation_report"]["checks"]
    assert body["validation_report"]["compatibility"]["stable_version"] is None
    assert body["validation_job"] == {"id": job.pk, "status": "succeeded", "error": ""}
    assert body["artifact_url"] == "/api/models/digits/versions/1/artifact"
    assert job.result == {"verdict": "ready", "reason": ""}
    assert list(Release.objects.values_list("routes", flat=True)) == [[{"version": 1, "weight": 100}]]
    assert AuditEvent.objects.filter(kind="version_uploaded").count() == 1


def lock_not_taken(*args, **kwargs):
    raise LockWaitTimeout("the generation row was not locked within 10 s")


def test_a_version_whose_route_could_not_be_recorded_is_not_left_ready_and_unrouted(operator_client, model, good_onnx, monkeypatch):
    """Ready was committed before the first route and the benchmark: with the generation lock
    held past its timeout (or the job killed there), v1 stayed ready, unrouted and never
    measured for good. Now nothing of the verdict is kept, and the job tries again."""
    upload(operator_client, good_onnx)
    monkeypatch.setattr(releases, "route_first_version", lock_not_taken)

    (job,) = run_queued_jobs("validation")

    assert (job.status, job.attempts) == (JobStatus.QUEUED, 1)
    assert job.error.startswith("attempt 1: the inspection passed, but the verdict could not be recorded")
    assert (version(1).status, Release.objects.count(), Job.objects.filter(kind=JobKind.BENCHMARK).count()) == ("validating", 0, 0)


def test_a_lock_held_once_past_its_timeout_delays_the_verdict_and_costs_nothing_else(operator_client, model, good_onnx, monkeypatch):
    upload(operator_client, good_onnx)
    monkeypatch.setattr(releases, "route_first_version", lock_not_taken)
    run_queued_jobs("validation")
    monkeypatch.undo()

    (job,) = run_queued_jobs("validation")

    assert (job.status, version(1).status) == (JobStatus.SUCCEEDED, "ready")
    assert list(Release.objects.values_list("routes", flat=True)) == [[{"version": 1, "weight": 100}]]
    assert Job.objects.filter(kind=JobKind.BENCHMARK).count() == 1


def test_a_lock_held_past_its_timeout_at_every_attempt_rejects_the_version_saying_so(operator_client, model, good_onnx, monkeypatch, settings):
    settings.JOB_MAX_ATTEMPTS = 2
    upload(operator_client, good_onnx)
    monkeypatch.setattr(releases, "route_first_version", lock_not_taken)

    run_queued_jobs("validation")
    (job,) = run_queued_jobs("validation")

    assert (job.status, version(1).status, Release.objects.count()) == (JobStatus.FAILED, "rejected", 0)
    assert version(1).status_reason == ("validation could not run: the inspection passed, but the verdict could not be recorded: another "
                                        "change held a row lock it needs (the generation's, the model's or the version's) past "
                                        "DATABASE_LOCK_TIMEOUT_S (after 2 attempts)")


def test_a_version_whose_jobs_could_not_be_queued_is_neither_ready_nor_routed(operator_client, model, good_onnx, monkeypatch):
    upload(operator_client, good_onnx)

    def broken(*args, **kwargs):
        raise RuntimeError("the jobs table refused the row")

    monkeypatch.setattr(scheduling, "version_ready", broken)

    (job,) = run_queued_jobs("validation")

    assert (job.status, version(1).status, Release.objects.count()) == (JobStatus.FAILED, "rejected", 0)


def test_an_inline_registration_whose_route_could_not_be_recorded_leaves_no_version(operator, model, good_onnx, monkeypatch):
    monkeypatch.setattr(releases, "route_first_version", lock_not_taken)

    with pytest.raises(LockWaitTimeout), open(good_onnx, "rb") as source:
        uploads.register_stream(model, source, uploaded_by=operator)

    assert (ModelVersion.objects.count(), Release.objects.count()) == (0, 0)


def test_a_later_ready_version_is_compared_with_the_stable_one_and_not_routed(operator_client, ready_stable, tmp_path):
    other = tmp_path / "sixty.onnx"
    other.write_bytes(to_bytes(random_mlp([60, 10], seed=2)))
    upload(operator_client, other)

    run_queued_jobs("validation")

    compatibility = version(2).validation_report["compatibility"]
    assert (version(2).status, compatibility["stable_version"], compatibility["compatible"]) == ("ready", 1, False)
    assert Release.objects.count() == 1


def test_a_file_that_fails_inspection_ends_rejected_with_its_report_and_no_artifact(operator_client, model, checker_failing_onnx, artifact_root):
    upload(operator_client, checker_failing_onnx)

    (job,) = run_queued_jobs("validation")

    rejected = version(1)
    assert rejected.status == "rejected"
    assert rejected.status_reason.startswith("the ONNX checker refused the model")
    assert rejected.validation_report["refused"] == rejected.status_reason
    assert [check["name"] for check in rejected.validation_report["checks"] if check["ok"]][:1] == ["parse"]  # the checks run so far
    assert (job.status, job.result["verdict"], job.result["reason"]) == ("succeeded", "rejected", rejected.status_reason)
    assert stored_files(artifact_root) == []
    assert Release.objects.count() == 0
    refusal = AuditEvent.objects.get(kind="upload_refused")
    assert refusal.message == f"Upload refused: version 1 rejected: {rejected.status_reason}"
    assert refusal.data == {"version": 1, "sha256": rejected.sha256}


def test_a_rejected_version_keeps_its_number(operator_client, model, unknown_domain_onnx, good_onnx):
    upload(operator_client, unknown_domain_onnx)
    run_queued_jobs("validation")

    second = upload(operator_client, good_onnx).json()
    run_queued_jobs("validation")

    assert second["number"] == 2
    assert [(v.number, v.status) for v in ModelVersion.objects.order_by("number")] == [(1, "rejected"), (2, "ready")]
    assert Release.objects.get().routes == [{"version": 2, "weight": 100}]  # the first *ready* version


def test_a_rejected_upload_of_bytes_a_ready_version_has_keeps_the_file(operator_client, ready_stable, good_onnx, artifact_root):
    upload(operator_client, good_onnx, allow_duplicate="true")  # v2: the same bytes as v1, a copy asked for
    records.cancel(Job.objects.get(version__number=2))

    assert version(2).status == "rejected"
    assert storage.exists(ready_stable.sha256)
    assert [path.name for path in stored_files(artifact_root)] == [ready_stable.sha256]


# ---------------------------------------------------------------- refused at once: nothing created


@pytest.mark.parametrize(
    ("fixture_name", "words"),
    [("empty_file", "the artifact is empty"), ("random_bytes_file", "not an ONNX model"), ("truncated_onnx", "cut short")],
)
def test_a_cheap_refusal_is_immediate_and_leaves_nothing(request, operator_client, model, artifact_root, fixture_name, words):
    response = upload(operator_client, request.getfixturevalue(fixture_name))

    assert response.status_code == 400
    assert words in response.json()["error"]
    assert (ModelVersion.objects.count(), Job.objects.count(), Release.objects.count()) == (0, 0, 0)
    assert stored_files(artifact_root) == []
    assert AuditEvent.objects.filter(kind="upload_refused").count() == 1


def test_an_upload_over_the_limit_is_413_and_leaves_nothing(settings, operator_client, model, good_onnx, artifact_root):
    settings.MAX_UPLOAD_BYTES = 100

    response = upload(operator_client, good_onnx)

    assert response.status_code == 413
    assert (ModelVersion.objects.count(), Job.objects.count()) == (0, 0)
    assert stored_files(artifact_root) == []


def test_a_viewer_upload_is_403_and_leaves_nothing(viewer_client, model, good_onnx, artifact_root):
    response = upload(viewer_client, good_onnx)

    assert response.status_code == 403
    assert (ModelVersion.objects.count(), Job.objects.count()) == (0, 0)
    assert stored_files(artifact_root) == []


# ---------------------------------------------------------------- idempotent


def test_running_the_validation_twice_gives_one_verdict_one_route_and_one_audit_event(operator_client, model, good_onnx):
    upload(operator_client, good_onnx)
    job = Job.objects.get()
    claimed = records.claim(job.pk)

    first = validation.run(claimed)
    second = validation.run(claimed)  # the same job's handler again (a message delivered twice)

    assert first == second == {"verdict": "ready", "reason": ""}
    assert Release.objects.count() == 1
    assert AuditEvent.objects.filter(kind="version_uploaded").count() == 1
    assert runner.run(job.pk) is None  # a running job is not claimed again


def test_a_rejection_recorded_twice_is_one_audit_event(operator_client, model, good_onnx):
    upload(operator_client, good_onnx)

    assert uploads.mark_rejected(version(1), "first reason") is True
    assert uploads.mark_rejected(version(1), "second reason") is False

    assert version(1).status_reason == "first reason"
    assert AuditEvent.objects.filter(kind="upload_refused").count() == 1


def test_the_validation_job_is_created_once_per_version(operator_client, model, good_onnx):
    upload(operator_client, good_onnx)

    again = records.create(JobKind.VALIDATION, model, version=version(1), key=uploads.validation_key(version(1)))

    assert Job.objects.count() == 1 and again.pk == Job.objects.get().pk


# ---------------------------------------------------------------- a job that cannot run


def test_a_validation_job_swept_after_its_last_attempt_leaves_the_version_rejected_with_the_reason(settings, operator_client, model, good_onnx, artifact_root):
    upload(operator_client, good_onnx)
    job = records.claim(Job.objects.get().pk)
    Job.objects.filter(pk=job.pk).update(attempts=settings.JOB_MAX_ATTEMPTS, heartbeat_at=timezone.now() - timedelta(seconds=settings.JOB_STALE_AFTER_S + 1))

    records.sweep_stale()

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert version(1).status == "rejected"
    assert version(1).status_reason == f"validation could not run: {job.error}"
    assert "its Celery worker stopped" in version(1).status_reason
    assert stored_files(artifact_root) == []
    assert Release.objects.count() == 0


def test_a_validation_whose_bytes_are_gone_fails_and_rejects_the_version(operator_client, model, good_onnx):
    upload(operator_client, good_onnx)
    storage.path_for(version(1).sha256).unlink()  # lost from the store

    (job,) = run_queued_jobs("validation")

    assert job.status == JobStatus.FAILED
    assert version(1).status == "rejected"
    assert version(1).status_reason == "validation could not run: the uploaded bytes are no longer in the artifact store"


def test_a_cancelled_validation_leaves_the_version_rejected(operator_client, model, good_onnx, artifact_root):
    upload(operator_client, good_onnx)

    records.cancel(Job.objects.get())

    assert (version(1).status, version(1).status_reason) == ("rejected", "validation was cancelled")
    assert stored_files(artifact_root) == []
    assert run_queued_jobs() == []


def test_a_validation_cancelled_once_it_runs_stops_before_its_verdict(operator_client, model, good_onnx, artifact_root):
    upload(operator_client, good_onnx)
    job = records.claim(Job.objects.get().pk)
    records.cancel(job)  # running: its runner is asked to stop

    with pytest.raises(runner.JobCancelled):
        validation.run(job)  # asked before the inspection child starts, and at every poll while it runs
    records.cancelled(job)

    assert (version(1).status, version(1).status_reason) == ("rejected", "validation was cancelled")
    assert stored_files(artifact_root) == []


# ---------------------------------------------------------------- a version not ready is never served


def test_a_validating_version_cannot_be_routed(operator_client, ready_stable, good_onnx_v2):
    upload(operator_client, good_onnx_v2)

    response = operator_client.post("/api/models/digits/release/", {"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}, format="json")

    assert response.status_code in (400, 409)
    assert "2" in response.json()["error"]
    assert Release.objects.count() == 1


def test_workers_get_no_artifact_of_a_version_not_ready(operator_client, worker_client, ready_stable, good_onnx_v2, checker_failing_onnx):
    upload(operator_client, good_onnx_v2)  # v2 stays validating
    upload(operator_client, checker_failing_onnx)  # v3 is rejected
    runner.run(Job.objects.get(version__number=3).pk)

    validating = worker_client.get("/api/models/digits/versions/2/artifact")
    rejected = worker_client.get("/api/models/digits/versions/3/artifact")

    assert validating.status_code == 409 and "still being validated" in validating.json()["error"]
    assert rejected.status_code == 410 and "was rejected" in rejected.json()["error"]
    assert worker_client.get("/api/models/digits/versions/1/artifact").status_code == 200
    served = desired_state()["models"]["digits"]
    assert [route["version"] for route in served["routes"]] == [1] and served["warm"] == []


def test_retention_never_archives_a_version_being_validated(operator_client, model, ready_stable, good_onnx_v2):
    upload(operator_client, good_onnx_v2)  # v2: validating
    uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([64, 10], seed=5))), uploaded_by=None)  # v3: ready

    archived = retention.apply_retention(keep=1)

    assert archived == []
    assert version(2).status == "validating" and storage.exists(version(2).sha256)


def test_retention_keeps_the_newest_versions_not_counting_rejected_ones(operator_client, model, ready_stable, good_onnx_v2, checker_failing_onnx):
    uploads.register_stream(model, io.BytesIO(good_onnx_v2.read_bytes()), uploaded_by=None)  # v2: ready
    upload(operator_client, checker_failing_onnx)  # v3: rejected
    run_queued_jobs("validation")

    archived = retention.apply_retention(keep=1)

    assert archived == []
    assert version(2).status == "ready" and storage.exists(version(2).sha256)


# ---------------------------------------------------------------- what a ready version sets off


def test_a_version_made_ready_by_its_job_or_inline_asks_for_its_follow_up_jobs(monkeypatch, operator_client, model, good_onnx, good_onnx_v2):
    asked = []
    monkeypatch.setattr(scheduling, "version_ready", lambda version: asked.append(version.number) or [])
    upload(operator_client, good_onnx)
    run_queued_jobs("validation")
    uploads.register_stream(model, io.BytesIO(good_onnx_v2.read_bytes()), uploaded_by=None)

    assert asked == [1, 2]


def test_a_cancelled_validation_is_put_on_whoever_cancelled_it_not_on_the_uploader(operator_client, model, good_onnx, admin_user):
    upload(operator_client, good_onnx)

    admin_client = APIClient()
    admin_client.force_authenticate(admin_user)
    admin_client.post(f"/api/models/digits/jobs/{Job.objects.get().pk}/cancel/")

    refused = AuditEvent.objects.get(kind="upload_refused")
    cancelled = AuditEvent.objects.get(kind="job")
    assert (refused.actor.username, refused.message) == ("ada", "Upload refused: version 1 rejected: validation was cancelled")
    assert (cancelled.actor.username, cancelled.message) == ("ada", f"Validation job #{Job.objects.get().pk} of version 1 cancelled")
