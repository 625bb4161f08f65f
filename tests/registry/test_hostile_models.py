"""Hostile and awkward model files uploaded through the REST API: rejected by their
validation job with the reason (no artifact kept, never routed), or registered with what
the worker must know (``batchable``)."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest

from registry.actions import uploads
from registry.building.onnx_build import to_bytes
from registry.fleet.state import desired_state
from registry.models import AuditEvent, ModelVersion, RegisteredModel, Release
from tests.fixtures.jobs import run_queued_jobs, validated
from tests.fixtures.onnx_files import (
    ESCAPING_LOCATION,
    EXTERNAL_DATA_PLACES,
    build_declared_input_shape,
    build_external_entry_without_the_flag,
    build_reduce_over_batch,
    build_sequence_softmax,
    write_model,
)
from tests.fixtures.store import stored_files

pytestmark = pytest.mark.django_db


@pytest.fixture
def model(operator) -> RegisteredModel:
    return RegisteredModel.objects.create(name="digits", created_by=operator)


def upload(client, path, name="digits"):
    with open(path, "rb") as handle:
        return client.post(f"/api/models/{name}/versions/", {"artifact": handle}, format="multipart")


def assert_nothing_registered(artifact_root, refusals: int) -> None:
    assert ModelVersion.objects.count() == 0
    assert Release.objects.count() == 0
    assert stored_files(artifact_root) == []
    assert AuditEvent.objects.filter(kind="upload_refused").count() == refusals


def assert_rejected_and_kept_nothing(body: dict, artifact_root) -> None:
    assert body["status"] == "rejected"
    assert Release.objects.count() == 0
    assert stored_files(artifact_root) == []
    assert AuditEvent.objects.filter(kind="upload_refused").count() == 1


@pytest.mark.parametrize("place", sorted(EXTERNAL_DATA_PLACES))
def test_external_data_anywhere_in_the_file_is_rejected_by_its_validation(place, operator_client, model, artifact_root, tmp_path):
    path = write_model(tmp_path, f"{place}.onnx", EXTERNAL_DATA_PLACES[place]())

    body = validated(operator_client, upload(operator_client, path))

    reason = body["status_reason"]
    assert f"points at external data '{ESCAPING_LOCATION}'" in reason
    assert "external data files are not accepted" in reason
    assert_rejected_and_kept_nothing(body, artifact_root)


def test_a_tensor_naming_an_external_file_without_the_external_flag_is_rejected_by_its_validation(operator_client, model,
                                                                                                     artifact_root, tmp_path):
    # The ONNX checker and ONNX Runtime both accept this file (they go by the flag): only the
    # external-data check stands between it and a registered version.
    path = write_model(tmp_path, "entry-without-flag.onnx", build_external_entry_without_the_flag(location="/etc/hostname"))

    body = validated(operator_client, upload(operator_client, path))

    assert "tensor 'W0' points at external data '/etc/hostname'" in body["status_reason"]
    assert_rejected_and_kept_nothing(body, artifact_root)


@pytest.mark.parametrize("shape", [["batch", -1], ["batch", 0], ["batch", 2**40]], ids=["negative", "zero", "absurd"])
def test_unservable_declared_dimension_is_rejected_with_its_reason_not_a_crash(shape, operator_client, model, artifact_root, tmp_path):
    path = write_model(tmp_path, "dims.onnx", build_declared_input_shape(shape))

    body = validated(operator_client, upload(operator_client, path))

    assert body["status_reason"].startswith(f"input 'x' declares a dimension of {shape[1]}")
    assert_rejected_and_kept_nothing(body, artifact_root)


def hold_the_only_slot(settings, seconds: float) -> subprocess.Popen:
    """Another process holds the only inspection slot for ``seconds``."""
    settings.INSPECTION_MAX_CONCURRENT = 1
    slot = settings.DATA_DIR / "inspection-slots" / "slot-0"
    slot.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", ("import fcntl, sys, time; f = open(sys.argv[1], 'ab'); "
                                f"fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep({seconds})"), str(slot)],
        stdout=subprocess.PIPE,
    )
    assert holder.stdout.readline() == b"held\n"
    return holder


def test_inline_registration_beyond_the_concurrent_inspections_is_a_503_that_leaves_nothing(settings, model, good_onnx, artifact_root):
    holder = hold_the_only_slot(settings, 60)
    try:
        with pytest.raises(uploads.UploadRefused) as refused:
            uploads.register_stream(model, io.BytesIO(good_onnx.read_bytes()), uploaded_by=None)
    finally:
        holder.kill()
        holder.wait(timeout=10)

    assert (refused.value.status, refused.value.retry_after_s) == (503, 5)
    assert refused.value.reason == "too many inspections are running (limit 1); try again shortly"
    assert_nothing_registered(artifact_root, refusals=0)


def test_a_validation_job_waits_for_a_free_inspection_slot_instead_of_refusing(settings, operator_client, model, good_onnx):
    response = upload(operator_client, good_onnx)
    holder = hold_the_only_slot(settings, 1.5)
    started = time.monotonic()
    try:
        (job,) = run_queued_jobs("validation")
    finally:
        holder.kill()
        holder.wait(timeout=10)

    assert time.monotonic() - started >= 1.0  # it waited for the holder to let go
    assert (job.status, job.result["verdict"]) == ("succeeded", "ready")
    assert ModelVersion.objects.get(number=response.json()["number"]).status == "ready"


@pytest.mark.parametrize("build", [build_reduce_over_batch, build_sequence_softmax], ids=["reduce-over-batch", "sequence-softmax"])
def test_model_mixing_rows_is_registered_as_not_batchable(build, operator_client, model, tmp_path):
    path = tmp_path / "mixing.onnx"
    path.write_bytes(to_bytes(build()))

    body = validated(operator_client, upload(operator_client, path))

    assert body["status"] == "ready"
    assert body["signature"]["batchable"] is False
    assert body["validation_report"]["not_batchable_reason"]
    # The desired state hands workers the signature, flag included.
    assert desired_state()["models"]["digits"]["routes"][0]["signature"]["batchable"] is False


def test_demo_style_mlp_is_registered_as_batchable(operator_client, model, good_onnx):
    body = validated(operator_client, upload(operator_client, good_onnx))

    assert body["signature"]["batchable"] is True
