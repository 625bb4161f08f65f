"""Inspect an uploaded ONNX artifact before the registry accepts it.

Why a child process: parsing a hostile protobuf and building an ONNX Runtime session
run native code that can segfault, spin forever or allocate without bound. Doing that
inside the (threaded) Django server would let one bad upload take the server down. So
``inspect_artifact`` starts a fresh interpreter (``python -m registry.inspection PATH``;
a fresh exec, never a fork of the server's threads), gives it an address-space limit and
a wall-clock timeout, and reads one JSON object from its stdout. A signal, a timeout or
an exhausted memory limit becomes an ``InspectionError`` with a readable reason.

The child runs the checks in this order, stopping at the first refusal:
parse (400) -> no external data -> known operator domains -> onnx checker ->
tensor-only signature -> ONNX Runtime session -> one smoke run (all 422).

This module imports no Django; the server process never imports onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

logger = logging.getLogger(__name__)

_PROJECT_ROOT = Path(__file__).resolve().parent.parent

# Measured on this project's CPU box (ORT 1.31, one thread, MALLOC_ARENA_MAX=2): a
# small model peaks at ~170 MiB of address space; a 1.94 GB model peaks at 9.8 GB,
# about 5x its size (file bytes, parsed proto, the checker's copies, ORT's copy and
# prepacked weights). 1 GiB plus 6x the file lets a 2 GB model load with ~25% to spare,
# while a 10 kB model that asks for 4 GiB at run time is stopped at ~1 GiB.
BASE_MEMORY_LIMIT_BYTES = 1024 * 1024 * 1024
MEMORY_LIMIT_BYTES_PER_MODEL_BYTE = 6

ONNX_RUNTIME_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})
MAX_REASON_CHARS = 400

V2_DATATYPES = {
    TensorProto.FLOAT: "FP32",
    TensorProto.DOUBLE: "FP64",
    TensorProto.FLOAT16: "FP16",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.INT8: "INT8",
    TensorProto.INT16: "INT16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.UINT8: "UINT8",
    TensorProto.UINT16: "UINT16",
    TensorProto.UINT32: "UINT32",
    TensorProto.UINT64: "UINT64",
    TensorProto.BOOL: "BOOL",
    TensorProto.STRING: "BYTES",
}

# BF16 has no NumPy dtype: its zeros are built as uint16 and tagged for ORT.
_NUMPY_DTYPES = {
    "FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "BF16": np.uint16,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "BOOL": np.bool_, "BYTES": object,
}

_NON_TENSOR_KINDS = {
    "sequence_type": "a sequence",
    "map_type": "a map",
    "optional_type": "an optional",
    "sparse_tensor_type": "a sparse tensor",
    None: "of no declared type",
}


class InspectionError(Exception):
    """The artifact was refused; ``reason`` is a sentence for the uploader.

    ``status`` is 400 when the file is not an ONNX model at all, 422 when it is one
    but cannot be served, 500 when the inspection itself failed (our bug, logged).
    ``report`` holds the checks run so far.
    """

    def __init__(self, reason: str, *, status: int = 422, report: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.report = report or {}


@dataclass
class InspectionReport:
    signature: dict
    opset: int
    producer: str
    report: dict


# ---------------------------------------------------------------- parent side


def inspect_artifact(
    path: str | os.PathLike,
    *,
    timeout_s: float = 60,
    memory_limit_bytes: int | None = None,
) -> InspectionReport:
    """Inspect the ONNX file at ``path`` in a child process; raise InspectionError.

    ``memory_limit_bytes=None`` sizes the limit from the file (see
    ``default_memory_limit_bytes``).
    """
    path = Path(path).resolve()
    if memory_limit_bytes is None:
        memory_limit_bytes = default_memory_limit_bytes(path.stat().st_size)
    completed = _run_child(path, timeout_s, memory_limit_bytes)
    return _result_from_child(completed, memory_limit_bytes)


def default_memory_limit_bytes(artifact_size_bytes: int) -> int:
    """The child's address-space limit for a model file of this size."""
    return BASE_MEMORY_LIMIT_BYTES + MEMORY_LIMIT_BYTES_PER_MODEL_BYTE * artifact_size_bytes


def _child_command(path: Path, memory_limit_bytes: int) -> list[str]:
    return [sys.executable, "-m", "registry.inspection", str(path), "--memory-limit-bytes", str(memory_limit_bytes)]


def _child_environment() -> dict[str, str]:
    # Every thread's glibc arena and BLAS buffer counts against RLIMIT_AS, and the
    # inspection needs no parallelism: pin both so the limit measures the model.
    environment = dict(os.environ)
    environment.update(MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return environment


def _run_child(path: Path, timeout_s: float, memory_limit_bytes: int) -> subprocess.CompletedProcess:
    try:
        # The child sets its own rlimits first thing: preexec_fn is unsafe in a
        # threaded parent (it can deadlock between fork and exec).
        return subprocess.run(
            _child_command(path, memory_limit_bytes),
            cwd=_PROJECT_ROOT,
            env=_child_environment(),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        # subprocess.run has already killed and reaped the child.
        raise InspectionError(f"inspection timed out after {timeout_s:g} s") from None


def _result_from_child(completed: subprocess.CompletedProcess, memory_limit_bytes: int) -> InspectionReport:
    result = _parse_child_output(completed.stdout)
    if result is None:
        raise _error_for_failed_child(completed, memory_limit_bytes)
    if not result["ok"]:
        raise InspectionError(result["reason"], status=result["status"], report=result["report"])
    return InspectionReport(
        signature=result["signature"], opset=result["opset"], producer=result["producer"], report=result["report"]
    )


def _parse_child_output(stdout: bytes) -> dict | None:
    try:
        return json.loads(stdout)
    except ValueError:  # empty or cut short: the child died before answering
        return None


def _error_for_failed_child(completed: subprocess.CompletedProcess, memory_limit_bytes: int) -> InspectionError:
    stderr = completed.stderr.decode("utf-8", "replace")
    if _mentions_memory_exhaustion(stderr):
        return InspectionError(_memory_reason(memory_limit_bytes))
    if completed.returncode < 0:
        return InspectionError(f"ONNX Runtime crashed while loading the model (signal {-completed.returncode})")
    logger.error("inspection child failed with exit code %s: %s", completed.returncode, stderr[-4000:])
    return InspectionError(f"inspection failed unexpectedly (exit code {completed.returncode})", status=500)


def _mentions_memory_exhaustion(text: str) -> bool:
    markers = ("MemoryError", "bad_alloc", "bad allocation", "Failed to allocate memory")
    return any(marker in text for marker in markers)


def _memory_reason(memory_limit_bytes: int | None) -> str:
    limit = f" of {memory_limit_bytes / 2**30:.1f} GiB" if memory_limit_bytes else ""
    return f"inspection ran out of memory: the model needs more than the memory limit{limit}"


# ---------------------------------------------------------------- child side


class _Refusal(Exception):
    def __init__(self, reason: str, status: int = 422):
        super().__init__(reason)
        self.reason = reason
        self.status = status


def main(argv: list[str] | None = None) -> int:
    arguments = _parse_arguments(argv)
    _limit_resources(arguments.memory_limit_bytes)
    result_stream = _claim_stdout()
    result = _ChildInspection(Path(arguments.path), arguments.memory_limit_bytes).run()
    result_stream.write(json.dumps(result))
    result_stream.flush()
    return 0


def _peak_memory() -> dict:
    """Peak resident and virtual memory of this child, to tune the memory limit by."""
    peak = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:  # not Linux
        return peak
    match = re.search(r"^VmPeak:\s+(\d+) kB", status, re.MULTILINE)
    if match:
        peak["peak_virtual_memory_bytes"] = int(match.group(1)) * 1024
    return peak


def _parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m registry.inspection", description="Inspect one ONNX file.")
    parser.add_argument("path")
    parser.add_argument("--memory-limit-bytes", type=int, default=None)
    return parser.parse_args(argv)


def _limit_resources(memory_limit_bytes: int | None) -> None:
    # No core files: a crashing model must not leave gigabytes on the server's disk.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_limit_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))


def _claim_stdout():
    # Native libraries may print to fd 1; keep fd 1 for them (sent to stderr) and
    # write the one JSON answer to a private duplicate of the original stdout.
    result_fd = os.dup(sys.stdout.fileno())
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return os.fdopen(result_fd, "w")


class _ChildInspection:
    """One inspection: each ``_check_*`` step returns a message or raises _Refusal."""

    STEPS = ("parse", "external_data", "operator_domains", "checker", "signature", "session", "smoke_run")

    def __init__(self, path: Path, memory_limit_bytes: int | None):
        self.path = path
        self.memory_limit_bytes = memory_limit_bytes
        self.data = b""
        self.model: ModelProto | None = None
        self.signature: dict = {}
        self.session = None
        self.report: dict = {"checks": [], "artifact_size_bytes": None}

    def run(self) -> dict:
        try:
            for step in self.STEPS:
                self._run_step(step)
        except _Refusal as refusal:
            return {"ok": False, "status": refusal.status, "reason": refusal.reason, "report": self.report}
        self.report.update(_peak_memory())
        return {"ok": True, "signature": self.signature, "opset": self.signature["opset"],
                "producer": self.signature["producer"], "report": self.report}

    def _run_step(self, step: str) -> None:
        started = time.perf_counter()
        try:
            message = getattr(self, f"_check_{step}")()
        except MemoryError:
            refusal = _Refusal(_memory_reason(self.memory_limit_bytes))
        except _Refusal as caught:
            refusal = caught
        else:
            self._record(step, True, message, started)
            return
        self._record(step, False, refusal.reason, started)
        raise refusal

    def _record(self, step: str, ok: bool, message: str, started: float) -> None:
        elapsed_ms = round((time.perf_counter() - started) * 1000, 3)
        self.report["checks"].append({"name": step, "ok": ok, "message": message, "elapsed_ms": elapsed_ms})

    def _check_parse(self) -> str:
        self.data = self.path.read_bytes()
        self.report["artifact_size_bytes"] = len(self.data)
        self.model = _parse_model(self.data)
        self.report.update(_model_facts(self.model))
        return f"parsed ONNX model, IR version {self.model.ir_version}"

    def _check_external_data(self) -> str:
        _refuse_external_data(self.model)
        return "all tensors are stored inside the file"

    def _check_operator_domains(self) -> str:
        _refuse_unknown_domains(self.model)
        return "every operator domain is provided by ONNX Runtime"

    def _check_checker(self) -> str:
        _run_onnx_checker(self.model)
        return "onnx.checker passed (full_check)"

    def _check_signature(self) -> str:
        self.signature = _build_signature(self.model)
        # The proto is no longer needed; free it before ORT makes its own copy.
        self.model = None
        return f"{len(self.signature['inputs'])} input(s), {len(self.signature['outputs'])} output(s)"

    def _check_session(self) -> str:
        self.session = _create_session(self.data)
        self.data = b""
        self.report["provider"] = self.session.get_providers()[0]
        return f"ONNX Runtime session created on {self.report['provider']}"

    def _check_smoke_run(self) -> str:
        output_shapes, elapsed_ms = _smoke_run(self.session, self.signature["inputs"])
        self.report["smoke_run_ms"] = round(elapsed_ms, 3)
        self.report["smoke_output_shapes"] = output_shapes
        _refuse_mismatched_outputs(self.signature["outputs"], output_shapes)
        return f"ran once on synthesised inputs in {elapsed_ms:.1f} ms"


# -- parse


def _parse_model(data: bytes) -> ModelProto:
    if not data:
        raise _Refusal("the file is empty, not an ONNX model", status=400)
    try:
        # Always binary protobuf: onnx.load would guess a text format from the file name.
        model = onnx.load_model_from_string(data, format="protobuf")
    except (DecodeError, RuntimeError, ValueError) as error:
        raise _Refusal(f"the file is not an ONNX model: it is not a readable protobuf ({_trim(error)})", 400) from None
    if not model.ir_version or not model.HasField("graph"):
        # Protobuf parses many byte strings; a real model has a version and a graph.
        raise _Refusal("the file is not an ONNX model: it has no IR version or no graph", status=400)
    return model


def _model_facts(model: ModelProto) -> dict:
    nodes = list(_all_nodes(model))
    return {
        "ir_version": model.ir_version,
        "opset_imports": {(entry.domain or "ai.onnx"): entry.version for entry in model.opset_import},
        "op_count": len(nodes),
        "domains": sorted({node.domain or "ai.onnx" for node in nodes}),
        "onnx_version": onnx.__version__,
    }


# -- walking every graph, node and tensor, subgraphs and local functions included


def _all_graphs(model: ModelProto) -> Iterator[GraphProto]:
    yield from _graph_and_subgraphs(model.graph)
    for training in model.training_info:
        yield from _graph_and_subgraphs(training.initialization)
        yield from _graph_and_subgraphs(training.algorithm)


def _graph_and_subgraphs(graph: GraphProto) -> Iterator[GraphProto]:
    yield graph
    for node in graph.node:
        for subgraph in _node_subgraphs(node):
            yield from _graph_and_subgraphs(subgraph)


def _node_subgraphs(node) -> Iterator[GraphProto]:
    for attribute in node.attribute:
        if attribute.type == AttributeProto.GRAPH:
            yield attribute.g
        yield from attribute.graphs


def _all_nodes(model: ModelProto) -> Iterator:
    for graph in _all_graphs(model):
        yield from graph.node
    for function in model.functions:
        for node in function.node:
            yield node
            for subgraph in _node_subgraphs(node):
                for graph in _graph_and_subgraphs(subgraph):
                    yield from graph.node


def _all_tensors(model: ModelProto) -> Iterator[TensorProto]:
    for graph in _all_graphs(model):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from (sparse.values, sparse.indices)
    for node in _all_nodes(model):
        for attribute in node.attribute:
            yield from _attribute_tensors(attribute)


def _attribute_tensors(attribute: AttributeProto) -> Iterator[TensorProto]:
    if attribute.HasField("t"):
        yield attribute.t
    yield from attribute.tensors
    if attribute.HasField("sparse_tensor"):
        yield from (attribute.sparse_tensor.values, attribute.sparse_tensor.indices)
    for sparse in attribute.sparse_tensors:
        yield from (sparse.values, sparse.indices)


# -- external data and operator domains


def _refuse_external_data(model: ModelProto) -> None:
    for tensor in _all_tensors(model):
        if tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data):
            location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
            raise _Refusal(
                f"tensor '{tensor.name}' points at external data '{location}'; external data files "
                "are not accepted, store every tensor inside the .onnx file"
            )


def _refuse_unknown_domains(model: ModelProto) -> None:
    allowed = ONNX_RUNTIME_DOMAINS | {function.domain for function in model.functions}
    for node in _all_nodes(model):
        if node.domain not in allowed:
            raise _Refusal(
                f"operator domain '{node.domain}' (op '{node.op_type}') is not provided by ONNX Runtime"
            )


def _run_onnx_checker(model: ModelProto) -> None:
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise _Refusal(f"the ONNX checker refused the model: {_trim(error)}") from None


# -- signature


def _build_signature(model: ModelProto) -> dict:
    """The signature (docs/architecture.md, contract 0) of a parsed model; raises _Refusal for non-tensors."""
    # Since IR 4 an initializer may also be listed as an input (an optional override);
    # clients never send those, so they are not part of the signature.
    initializer_names = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializer_names]
    return {
        "inputs": [_tensor_spec(value, "input") for value in inputs],
        "outputs": [_tensor_spec(value, "output") for value in model.graph.output],
        "opset": _default_opset(model),
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
    }


def _tensor_spec(value, role: str) -> dict:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        described = _NON_TENSOR_KINDS.get(kind, f"a {kind}")
        raise _Refusal(f"only tensor inputs and outputs are supported: '{value.name}' is {described}")
    tensor_type = value.type.tensor_type
    if tensor_type.elem_type not in V2_DATATYPES:
        element = TensorProto.DataType.Name(tensor_type.elem_type)
        raise _Refusal(f"{role} '{value.name}' has element type {element}, which has no V2 datatype")
    if not tensor_type.HasField("shape"):
        raise _Refusal(f"{role} '{value.name}' has no declared shape (unknown rank); export it with a shape")
    shape = [_dimension(dimension) for dimension in tensor_type.shape.dim]
    return {"name": value.name, "datatype": V2_DATATYPES[tensor_type.elem_type], "shape": shape}


def _dimension(dimension) -> int | str | None:
    if dimension.HasField("dim_value"):
        return dimension.dim_value
    return dimension.dim_param or None


def _default_opset(model: ModelProto) -> int:
    versions = [entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")]
    return versions[0] if versions else 0


# -- ONNX Runtime


def _onnxruntime_errors() -> tuple[type[BaseException], ...]:
    # ORT's pybind exceptions share no base class below Exception; name them all.
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException",
             "InvalidProtobuf", "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail", "NotFound")
    return tuple(getattr(state, name) for name in names if hasattr(state, name)) + (RuntimeError, ValueError, TypeError)


def _create_session(data: bytes):
    # Imported here so that only the child process ever loads ONNX Runtime.
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only; warnings would flood the server log
    try:
        return onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except _onnxruntime_errors() as error:
        _raise_runtime_refusal("ONNX Runtime could not load the model", error)


def _smoke_run(session, input_specs: list[dict]) -> tuple[dict, float]:
    feeds = {spec["name"]: _synthetic_input(spec) for spec in input_specs}
    started = time.perf_counter()
    try:
        shapes = _run_for_output_shapes(session, feeds)
    except _onnxruntime_errors() as error:
        _raise_runtime_refusal("ONNX Runtime failed to run the model on synthesised inputs", error)
    elapsed_ms = (time.perf_counter() - started) * 1000
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, shapes)), elapsed_ms


def _run_for_output_shapes(session, feeds: dict) -> list[list[int] | None]:
    # OrtValues carry BF16 both ways, which NumPy cannot; but ORT only takes string
    # inputs as NumPy arrays, so a model with string inputs runs through plain run().
    if any(isinstance(value, np.ndarray) and value.dtype == object for value in feeds.values()):
        return _run_with_numpy(session, feeds)
    import onnxruntime

    ort_feeds = {name: _as_ort_value(onnxruntime, value) for name, value in feeds.items()}
    return [list(output.shape()) for output in session.run_with_ort_values(None, ort_feeds)]


def _run_with_numpy(session, feeds: dict) -> list[list[int] | None]:
    # NumPy cannot hold BF16 outputs: those are left out of this run (shape None).
    names = [output.name for output in session.get_outputs()]
    wanted = [output.name for output in session.get_outputs() if output.type != "tensor(bfloat16)"]
    shapes = dict(zip(wanted, (list(np.shape(value)) for value in session.run(wanted, feeds))))
    return [shapes.get(name) for name in names]


def _as_ort_value(onnxruntime, value):
    if isinstance(value, onnxruntime.OrtValue):
        return value
    return onnxruntime.OrtValue.ortvalue_from_numpy(value)


def _synthetic_input(spec: dict):
    """Zeros of the declared dtype; symbolic or unknown dimensions become 1."""
    shape = [dimension if isinstance(dimension, int) else 1 for dimension in spec["shape"]]
    if spec["datatype"] == "BYTES":
        return np.full(shape, "", dtype=object)
    array = np.zeros(shape, dtype=_NUMPY_DTYPES[spec["datatype"]])
    if spec["datatype"] == "BF16":
        import onnxruntime

        return onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(array, TensorProto.BFLOAT16)
    return array


def _refuse_mismatched_outputs(output_specs: list[dict], output_shapes: dict) -> None:
    # Workers split batches along the declared shapes, so a model that returns other
    # shapes than it declares cannot be served correctly.
    for spec in output_specs:
        actual = output_shapes.get(spec["name"])
        if actual is not None and not _shape_matches(spec["shape"], actual):
            raise _Refusal(
                f"output '{spec['name']}' has shape {actual} on the smoke run, but the model declares {spec['shape']}"
            )


def _shape_matches(declared: list, actual: list[int]) -> bool:
    if len(declared) != len(actual):
        return False
    return all(not isinstance(expected, int) or expected == got for expected, got in zip(declared, actual))


def _raise_runtime_refusal(what: str, error: BaseException) -> None:
    # ORT turns a failed allocation under RLIMIT_AS into an ordinary error; report it
    # as the memory limit it is (the step runner words MemoryError).
    if _mentions_memory_exhaustion(str(error)):
        raise MemoryError(_trim(error)) from None
    raise _Refusal(f"{what}: {_trim(error)}") from None


_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
# "/onnxruntime_src/.../reshape_helper.h:91 onnxruntime::ReshapeHelper::ReshapeHelper(...) "
_SOURCE_LOCATION = re.compile(r"(?:/[\w.+-]+)+\.(?:h|hpp|cc|cpp|cu):\d+ ")
# "void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*) "
_CPP_FUNCTION = re.compile(r"(?:\w+\*? )?onnxruntime::[\w:~<>]+\([^)]*\)(?: const)? ")


def _trim(error: BaseException) -> str:
    """One readable line: no ORT code prefix, no source locations, no newlines, short."""
    text = _ORT_PREFIX.sub("", " ".join(str(error).split()))
    text = _CPP_FUNCTION.sub("", _SOURCE_LOCATION.sub("", text))
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 3].rstrip() + "..."
    return text or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
