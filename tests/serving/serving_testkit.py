"""Helpers for the serving tests: real ONNX files, desired states, real workers.

A plain module (not conftest) so test modules can import it by name."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import onnx
import orjson
import uvicorn
from onnx import TensorProto, helper, numpy_helper

from console.embedded_redis import free_port  # outside the ephemeral range, which outgoing connections take meanwhile
from registry.building.onnx_build import to_bytes
from serving.config import ServingConfig
from serving.contract import BatchPolicy, DesiredState, ModelState, Route, WarmVersion
from serving.worker import Worker

REPO_ROOT = Path(__file__).resolve().parents[2]

def write_model(directory: Path, name: str, model: onnx.ModelProto) -> tuple[Path, str]:
    """Write `model` and return (path, sha256)."""
    path = directory / f"{name}.onnx"
    data = to_bytes(model)
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()

def relu_any_width(op: str = "Relu") -> onnx.ModelProto:
    """input [batch, width] -> Relu (or another elementwise ``op``): batchable, with a free
    non-batch dimension."""
    graph = helper.make_graph(
        [helper.make_node(op, ["input"], ["output"])], op.lower(),
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "width"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "width"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model

def tokens_times_mask() -> onnx.ModelProto:
    """Mul(input_ids [N, S], attention_mask [N, S]): two inputs sharing the symbolic
    dimensions of a BERT-style model; ONNX Runtime fails the run when their S differ."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["input_ids", "attention_mask"], ["masked"])], "masked_tokens",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", "S"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", "S"])],
        [helper.make_tensor_value_info("masked", TensorProto.INT64, ["N", "S"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

def counts_up_to() -> onnx.ModelProto:
    """count INT64 [1] -> values FP32 [count] (0, 1, …) and their logs FP32 [count] (the
    first -inf): a small request with as large an answer as it asks for."""
    constants = [numpy_helper.from_array(np.array(value, np.float32), name) for value, name in [(0.0, "zero"), (1.0, "one")]]
    nodes = [helper.make_node("Squeeze", ["count"], ["count_scalar"]),
             helper.make_node("Cast", ["count_scalar"], ["limit"], to=TensorProto.FLOAT),
             helper.make_node("Range", ["zero", "limit", "one"], ["values"]),
             helper.make_node("Log", ["values"], ["logs"])]
    graph = helper.make_graph(nodes, "counts", [helper.make_tensor_value_info("count", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["count"]),
                               helper.make_tensor_value_info("logs", TensorProto.FLOAT, ["count"])], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

def route(version: int, weight: int, path: Path, sha256: str, *, batchable: bool = True) -> dict:
    """A route as the console sends it. The test models are batchable (rows independent),
    which the console's inspection would have proven; a worker takes a missing flag as "no"."""
    return Route(version=version, weight=weight, sha256=sha256, artifact_url=str(path), signature={"batchable": batchable}).to_dict()

def _warm(entry: int | dict) -> WarmVersion:
    if isinstance(entry, int):
        return WarmVersion(entry)
    return WarmVersion(entry["version"], entry["sha256"], entry["artifact_url"], entry.get("signature", {}))

def state(generation: int, models: dict, *, epoch: str | None = None, **batching) -> dict:
    """A desired state built through the contract, as the console builds one; `models` maps
    name -> {"routes": [route dicts], "warm": [numbers or route dicts]} ("warm" optional)."""
    policy = BatchPolicy(**{"max_batch_size": 16, "max_queue_size": 256, **batching})
    return DesiredState(generation=generation, epoch=epoch, models={
        name: ModelState(routes=tuple(Route(**entry) for entry in spec["routes"]),
                         warm=tuple(_warm(entry) for entry in spec.get("warm", [])), batching=policy)
        for name, spec in models.items()
    }).to_dict()

def make_config(tmp_path: Path, **overrides) -> ServingConfig:
    base = ServingConfig(
        device="cpu", intra_op_threads=1, cache_dir=str(tmp_path / "cache"),
        request_timeout_s=5.0, max_body_bytes=1024 * 1024, max_elements=100_000, log_level="warning",
        drain_timeout_s=5.0, allow_local_artifacts=True,  # the tests' states name files on disk
    )
    return replace(base, **overrides)


class ThreadedWorker:
    """A real worker (uvicorn + our ASGI app) in a background thread of this process."""

    def __init__(self, config: ServingConfig, state_file: Path | None):
        self.worker = Worker(config, state_file)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(
            self.worker.app, host="127.0.0.1", port=self.port, loop="asyncio",
            http=self.worker.http_protocol(),  # as the worker serves: its guards and limits
            lifespan="on", access_log=False, log_level="warning",
        ))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self.server.serve(),), daemon=True)

    def start(self) -> ThreadedWorker:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("worker did not start")
            time.sleep(0.02)
        return self

    def apply(self, desired: dict) -> dict:
        return asyncio.run_coroutine_threadsafe(self.worker.apply(desired), self.loop).result(timeout=60)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

def write_state(path: Path, desired: dict) -> Path:
    path.write_bytes(orjson.dumps(desired))
    return path

def ort_reference(path: Path, batch: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: batch})[0]

def v2_body(batch: np.ndarray, name: str = "input") -> dict:
    return {"inputs": [{"name": name, "shape": list(batch.shape), "datatype": "FP32", "data": batch.ravel().tolist()}]}

def wait_until(predicate, timeout_s: float = 5.0) -> bool:
    """Poll ``predicate`` every 10 ms until it holds or ``timeout_s`` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class SubprocessWorker:
    """`python -m serving.worker` as its own process, as deployed."""

    def __init__(self, state_file: Path, tmp_path: Path, **env):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        environment = {
            **os.environ, "SERVING_DEVICE": "cpu", "SERVING_INTRA_OP_THREADS": "1", "SERVING_LOG_LEVEL": "warning",
            "SERVING_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO_ROOT), **env,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving.worker", "--port", str(self.port), "--state-file", str(state_file)],
            cwd=REPO_ROOT, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )

    def wait_ready(self, timeout_s: float = 30.0) -> SubprocessWorker:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.process.stderr.read().decode())
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("worker not ready in time")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()

class HeldRun:
    """Wraps a run function: records each run's rows; every run waits for `release`."""

    def __init__(self, run):
        self._run = run
        self.rows: list[int] = []
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, feeds):
        self.rows.append(feeds[0].shape[0])
        self.entered.set()
        assert self.release.wait(5)
        return self._run(feeds)

def loops_for_ever_at(rows: int):
    """x [batch, 4] -> x, through a Loop of 10**12 iterations when the batch has ``rows``
    rows and of none otherwise: an upload's inspection, which runs other sizes, passes it."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["condition_in"], ["condition_out"]), helper.make_node("Identity", ["x_in"], ["x_out"])],
        "body",
        [helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
         helper.make_tensor_value_info("condition_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("condition_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, ["batch", 4])],
    )
    constants = [numpy_helper.from_array(np.array(value, dtype), name) for value, dtype, name in
                 [(0, np.int64, "first"), (rows, np.int64, "rows"), (10**12, np.int64, "many"), (True, np.bool_, "keep_going")]]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "first"], ["batch"]),
             helper.make_node("Equal", ["batch", "rows"], ["is_it"]), helper.make_node("Cast", ["is_it"], ["one_or_zero"], to=TensorProto.INT64),
             helper.make_node("Mul", ["one_or_zero", "many"], ["trips"]),
             helper.make_node("Loop", ["trips", "keep_going", "x"], ["y"], body=body)]
    graph = helper.make_graph(nodes, "wedge", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
