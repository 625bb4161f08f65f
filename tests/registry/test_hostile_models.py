"""Hostile and awkward model files uploaded through the REST API: refused whole, or
registered with what the worker must know (``batchable``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from registry.building.onnx_build import to_bytes
from registry.fleet.state import desired_state
from registry.models import AuditEvent, ModelVersion, RegisteredModel, Release
from tests.fixtures.onnx_files import (
    ESCAPING_LOCATION,
    EXTERNAL_DATA_PLACES,
    build_declared_input_shape,
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


@pytest.mark.parametrize("place", sorted(EXTERNAL_DATA_PLACES))
def test_external_data_anywhere_in_the_file_is_refused_at_upload(place, operator_client, model, artifact_root, tmp_path):
    path = write_model(tmp_path, f"{place}.onnx", EXTERNAL_DATA_PLACES[place]())

    response = upload(operator_client, path)

    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert f"points at external data '{ESCAPING_LOCATION}'" in error
    assert "external data files are not accepted" in error
    assert_nothing_registered(artifact_root, refusals=1)


@pytest.mark.parametrize("shape", [["batch", -1], ["batch", 0], ["batch", 2**40]], ids=["negative", "zero", "absurd"])
def test_unservable_declared_dimension_is_a_422_not_a_500(shape, operator_client, model, artifact_root, tmp_path):
    path = write_model(tmp_path, "dims.onnx", build_declared_input_shape(shape))

    response = upload(operator_client, path)

    assert response.status_code == 422, response.content
    assert response.json()["error"].startswith(f"input 'x' declares a dimension of {shape[1]}")
    assert_nothing_registered(artifact_root, refusals=1)


def test_upload_beyond_the_concurrent_inspections_is_a_503_that_leaves_nothing(settings, operator_client, model, good_onnx, artifact_root):
    settings.INSPECTION_MAX_CONCURRENT = 1
    slot = settings.DATA_DIR / "inspection-slots" / "slot-0"
    slot.parent.mkdir(parents=True, exist_ok=True)
    # Another console process holds the only slot.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'ab'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(slot)],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"held\n"
        response = upload(operator_client, good_onnx)
    finally:
        holder.kill()
        holder.wait(timeout=10)

    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "5"
    assert response.json() == {"error": "too many inspections are running (limit 1); try again shortly"}
    assert_nothing_registered(artifact_root, refusals=0)
    assert upload(operator_client, good_onnx).status_code == 201  # the slot is free again


@pytest.mark.parametrize("build", [build_reduce_over_batch, build_sequence_softmax], ids=["reduce-over-batch", "sequence-softmax"])
def test_model_mixing_rows_is_registered_as_not_batchable(build, operator_client, model, tmp_path):
    path = tmp_path / "mixing.onnx"
    path.write_bytes(to_bytes(build()))

    response = upload(operator_client, path)

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["signature"]["batchable"] is False
    assert body["validation_report"]["not_batchable_reason"]
    # The desired state hands workers the signature, flag included.
    assert desired_state()["models"]["digits"]["routes"][0]["signature"]["batchable"] is False


def test_demo_style_mlp_is_registered_as_batchable(operator_client, model, good_onnx):
    response = upload(operator_client, good_onnx)

    assert response.status_code == 201, response.content
    assert response.json()["signature"]["batchable"] is True
