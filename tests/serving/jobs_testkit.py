"""Helpers for the serving/jobs tests: small models whose answers are known, the job CLI
as a real child process, and ONNX Runtime's own answers to compare with.

A plain module (not conftest) so test modules can import it by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from registry.building.onnx_build import OPSET, mlp_from_weights, to_bytes

REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD_ENV = {"SERVING_DEVICE": "cpu", "SERVING_INTRA_OP_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}


def write_model(path: Path, model: onnx.ModelProto) -> Path:
    path.write_bytes(to_bytes(model))
    return path


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "jobs", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def identity_mlp(width: int) -> onnx.ModelProto:
    """input [batch, width] -> scores [batch, width] equal to the input: its argmax is the input's."""
    return mlp_from_weights([np.eye(width, dtype=np.float32)], [np.zeros(width, np.float32)],
                            output_name="scores", softmax=False)


def first_feature(width: int) -> onnx.ModelProto:
    """input [batch, width] -> value [batch, 1] equal to the input's first column."""
    weight = np.zeros((width, 1), np.float32)
    weight[0, 0] = 1.0
    return mlp_from_weights([weight], [np.zeros(1, np.float32)], output_name="value", softmax=False)


def sum_and_product(width: int) -> onnx.ModelProto:
    """Inputs a, b [batch, width] -> outputs sum = a + b and product = a * b."""
    def tensor(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])
    nodes = [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"], ["product"])]
    return _model(nodes, [tensor("a"), tensor("b")], [tensor("sum"), tensor("product")])


def relu_and_negated(width: int) -> onnx.ModelProto:
    """input [batch, width] -> outputs relu = Relu(input) and negated = -input."""
    def tensor(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])
    nodes = [helper.make_node("Relu", ["input"], ["relu"]), helper.make_node("Neg", ["input"], ["negated"])]
    return _model(nodes, [tensor("input")], [tensor("relu"), tensor("negated")])


def relu_any_width(output: str = "output") -> onnx.ModelProto:
    """input [batch, width] -> Relu, with the width dynamic too."""
    def tensor(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "width"])
    return _model([helper.make_node("Relu", ["input"], [output])], [tensor("input")], [tensor(output)])


def labels_of_argmax(labels: list[str]) -> onnx.ModelProto:
    """input [batch, len(labels)] -> the label of each row's largest value (a STRING output)."""
    nodes = [helper.make_node("ArgMax", ["input"], ["index"], axis=1, keepdims=0),
             helper.make_node("LabelEncoder", ["index"], ["label"], domain="ai.onnx.ml", keys_int64s=list(range(len(labels))),
                              values_strings=labels)]
    graph = helper.make_graph(nodes, "labels", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", len(labels)])],
                              [helper.make_tensor_value_info("label", TensorProto.STRING, ["batch"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def fixed_single_row(width: int) -> onnx.ModelProto:
    """input [1, width] -> Relu: a model that is not batchable."""
    nodes = [helper.make_node("Relu", ["input"], ["output"])]
    return _model(nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, width])],
                  [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, width])])


def ort_outputs(model_path: Path, feeds: dict) -> list[np.ndarray]:
    """ONNX Runtime's own answer, one session.run over the whole input."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@dataclass
class JobRun:
    returncode: int
    events: list[dict]
    stderr: str

    @property
    def last(self) -> dict:
        return self.events[-1]

    @property
    def result(self) -> dict:
        assert self.last["event"] == "result", (self.events[-3:], self.stderr[-2000:])
        return self.last["result"]

    @property
    def progress(self) -> list[dict]:
        return [event for event in self.events if event["event"] == "progress"]


def job_command(*args: object) -> list[str]:
    return [sys.executable, "-m", "serving.jobs", *map(str, args)]


def child_env(**extra: str) -> dict:
    return {**os.environ, **CHILD_ENV, **extra}


def run_job_cli(*args: object, timeout_s: float = 120) -> JobRun:
    """`python -m serving.jobs <args>` as a real child process; every stdout line must be JSON."""
    done = subprocess.run(job_command(*args), check=False, capture_output=True, text=True, env=child_env(), timeout=timeout_s,
                          cwd=REPO_ROOT)
    events = [json.loads(line) for line in done.stdout.splitlines()]
    return JobRun(done.returncode, events, done.stderr)


def captured_events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
