"""The engine against raw ONNX Runtime on the same inputs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from serving.batch_policy import PendingRequest
from serving.batch_run import run_batch
from serving.config import ServingConfig
from serving import engine as engine_module
from serving.engine import Engine, resolve_device


@pytest.fixture(scope="module")
def engine(mlp_v1):
    path, _ = mlp_v1
    return Engine(path.read_bytes(), ServingConfig(device="cpu", intra_op_threads=1), "cpu")


@pytest.fixture(scope="module")
def raw_session(mlp_v1):
    return ort.InferenceSession(str(mlp_v1[0]), providers=["CPUExecutionProvider"])


def test_device_falls_back_to_cpu_without_a_working_cuda_provider(monkeypatch, request):
    """Independent of this host's GPU: CUDA missing, or listed but failing to load, is CPU."""

    def failing_session(*args, **kwargs):
        raise RuntimeError("CUDA provider failed to load")

    request.addfinalizer(engine_module._probe_device.cache_clear)  # later callers probe the real host
    engine_module._probe_device.cache_clear()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    missing = resolve_device(ServingConfig(device="auto"))
    engine_module._probe_device.cache_clear()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", failing_session)
    failing = resolve_device(ServingConfig(device="auto"))

    assert (missing, failing) == ("cpu", "cpu")


def test_names_and_shapes_are_read_from_the_model(engine):
    assert [(spec.name, spec.datatype, spec.metadata_shape) for spec in engine.inputs] == [("input", "FP32", [-1, 64])]
    assert [(spec.name, spec.metadata_shape) for spec in engine.outputs] == [("probabilities", [-1, 10])]
    assert engine.is_batchable


def test_unbatched_run_equals_raw_onnx_runtime(engine, raw_session):
    batch = np.random.default_rng(0).standard_normal((5, 64), dtype=np.float32)

    expected = raw_session.run(None, {"input": batch})[0]

    np.testing.assert_allclose(engine.run((batch,))[0], expected, atol=1e-5)


def test_batched_requests_equal_raw_onnx_runtime_per_request(engine, raw_session):
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((rows, 64), dtype=np.float32) for rows in (1, 3, 2)]
    requests = [PendingRequest((array,), array.shape[0], 0.0, 1.0, None) for array in arrays]

    results, _ = run_batch(engine.run, requests)

    for array, (output,) in zip(arrays, results):
        np.testing.assert_allclose(output, raw_session.run(None, {"input": array})[0], atol=1e-5)


def test_warm_up_runs_every_batch_size_and_returns_timing_samples(engine):
    samples = engine.warm(8)

    assert {rows for rows, _ in samples} == {1, 4, 8}
    assert all(seconds > 0 for _, seconds in samples)


def test_warm_up_runs_every_batch_size_the_batcher_can_emit(engine, monkeypatch):
    seen, original = [], engine.run
    monkeypatch.setattr(engine, "run", lambda feeds: seen.append(feeds[0].shape[0]) or original(feeds))

    engine.warm(8)

    assert set(seen) == set(range(1, 9))


def test_the_datatypes_uploads_accept_as_inputs_are_those_a_worker_decodes():
    from serving.contract import SERVABLE_INPUT_DATATYPES
    from serving.engine import V2_TO_NUMPY

    assert SERVABLE_INPUT_DATATYPES == set(V2_TO_NUMPY)
