"""The worker as deployed: its own process (`python -m serving.worker`), driven by tritonclient."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton

from serving_testkit import SubprocessWorker, ort_reference, route, state, write_state


@pytest.fixture(scope="module")
def process_worker(tmp_path_factory, mlp_v1):
    tmp_path = tmp_path_factory.mktemp("process")
    state_file = write_state(tmp_path / "state.json", state(4, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}))
    worker = SubprocessWorker(state_file, tmp_path).wait_ready()
    yield worker
    worker.stop()


def test_the_listen_queue_is_as_long_as_the_connection_cap(process_worker):
    # uvicorn's default (2,048) is shorter than the 4,096-connection cap: past it, the
    # kernel drops a new client's SYN and the client waits a 1 s retransmission.
    port = process_worker.url.rsplit(":", 1)[1]
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout.split()
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())

    assert int(listening[2]) == min(4096, somaxconn)  # Send-Q of a listening socket: its backlog


def test_the_worker_runs_from_an_empty_private_directory_not_the_code_tree(tmp_path, mlp_v1):
    """ONNX Runtime resolves a file a model names against the working directory: it was
    the code tree (wherever the process started) for `python -m serving.worker`."""
    state_file = write_state(tmp_path / "state.json", state(4, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}))
    worker = SubprocessWorker(state_file, tmp_path).wait_ready()
    try:
        directory = Path(f"/proc/{worker.process.pid}/cwd").readlink()
        assert directory.name.startswith("modelops-worker-")
        assert (directory.stat().st_mode & 0o777, list(directory.iterdir())) == (0o700, [])
    finally:
        worker.stop()
    assert not directory.exists()  # removed at the stop


@pytest.fixture
def triton_client(process_worker):
    client = triton.InferenceServerClient(process_worker.url.removeprefix("http://"))
    yield client
    client.close()


def test_tritonclient_reads_server_and_model_metadata(triton_client):
    assert triton_client.is_server_live() and triton_client.is_server_ready()
    assert triton_client.is_model_ready("digits")
    metadata = triton_client.get_model_metadata("digits")

    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert metadata["parameters"]["generation"] == 4
    assert "binary_tensor_data" in triton_client.get_server_metadata()["extensions"]


def test_tritonclient_infers_with_binary_data_by_default(triton_client, mlp_v1):
    batch = np.random.default_rng(5).standard_normal((4, 64), dtype=np.float32)
    tensor = triton.InferInput("input", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)  # binary_data=True is tritonclient's default

    result = triton_client.infer("digits", [tensor], outputs=[triton.InferRequestedOutput("probabilities")])

    np.testing.assert_allclose(result.as_numpy("probabilities"), ort_reference(mlp_v1[0], batch), atol=1e-5)
    assert result.get_response()["model_version"] == "1"


def test_tritonclient_infers_with_json_data_and_a_timeout(triton_client, mlp_v1):
    batch = np.ones((2, 64), np.float32)
    tensor = triton.InferInput("input", [2, 64], "FP32")
    tensor.set_data_from_numpy(batch, binary_data=False)

    result = triton_client.infer("digits", [tensor], model_version="1", timeout=5_000_000)

    np.testing.assert_allclose(result.as_numpy("probabilities"), ort_reference(mlp_v1[0], batch), atol=1e-5)


def test_tritonclient_sees_server_errors_as_exceptions(triton_client):
    tensor = triton.InferInput("input", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 3), np.float32))

    with pytest.raises(triton.InferenceServerException, match="dimension 1 must be 64"):
        triton_client.infer("digits", [tensor])



def test_tritonclient_reads_the_model_config(triton_client):
    config = triton_client.get_model_config("digits")

    assert (config["name"], config["platform"], config["max_batch_size"]) == ("digits", "onnxruntime_onnx", 16)
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("input", "TYPE_FP32", [64])]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert triton_client.get_model_config("digits", "1") == config


def test_tritonclient_reads_statistics_that_grow_with_inferences(triton_client):
    def stat() -> dict:
        (only,) = triton_client.get_inference_statistics("digits")["model_stats"]
        return only

    before = stat()
    tensor = triton.InferInput("input", [2, 64], "FP32")
    tensor.set_data_from_numpy(np.ones((2, 64), np.float32))
    for _ in range(3):
        triton_client.infer("digits", [tensor])

    after = stat()

    assert after["inference_count"] - before["inference_count"] == 6
    assert after["execution_count"] - before["execution_count"] == 3
    success, earlier = after["inference_stats"]["success"], before["inference_stats"]["success"]
    assert success["count"] - earlier["count"] == 3 and success["ns"] > earlier["ns"]
    assert "statistics" in triton_client.get_server_metadata()["extensions"]
