"""One ONNX Runtime session per loaded version, on the device chosen once per process.

The device is CUDA only when the CUDA execution provider really loads (a probe session
reports it in `get_providers()`), else CPU. On CUDA the hot path binds inputs and
outputs with IOBinding so ORT does one host-to-device and one device-to-host copy per
batch; on CPU it is a plain `session.run`.

Before any session is created the bytes are parsed and checked for external data
anywhere in the file (`serving.model_safety`): a worker does not trust that the console
inspected what it is told to load, and ONNX Runtime would read such a reference
relative to the process's working directory. Sessions load from bytes, never a path.

Warm-up runs every batch size the batcher can emit (1..max_batch_size), once each, so
no client pays a first-shape cost (CUDA kernels, cuDNN algorithm search, ORT's memory
pattern for a new shape). Padding to power-of-two buckets would warm fewer shapes but
cost up to 2x compute on CPU, where most of our workers run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import onnxruntime as ort

from serving import run_memory
from serving.config import ConfigError, ServingConfig
from serving.model_safety import check_model_bytes
from serving.run_stop import current_options, stopped_after

logger = logging.getLogger("serving.engine")

ONNX_TO_V2 = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64", "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32",
    "tensor(int64)": "INT64", "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16", "tensor(string)": "BYTES",
}
V2_TO_NUMPY = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
GRAPH_OPTIMIZATION = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
EXECUTION_MODE = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL, "parallel": ort.ExecutionMode.ORT_PARALLEL}
CUDNN_SEARCH = {"exhaustive": "EXHAUSTIVE", "heuristic": "HEURISTIC", "default": "DEFAULT"}
QUIET_SEVERITY = 4  # fatal only: a failed CUDA probe is expected on CPU machines
DEFAULT_SEVERITY = 2


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input or output, as the model declares it."""

    name: str
    datatype: str  # KServe V2 name
    shape: tuple[int | None, ...]  # None: dynamic (symbolic or unnamed)
    # A dynamic dimension's symbolic name (ONNX dim_param), else None: inputs that name the
    # same dimension must agree on it (`protocol.check_shared_dims`).
    dim_names: tuple[str | None, ...] = field(default=(), compare=False)

    @property
    def dtype(self) -> np.dtype | None:
        return V2_TO_NUMPY.get(self.datatype)

    @property
    def metadata_shape(self) -> list[int]:
        return [-1 if dim is None else dim for dim in self.shape]


def tensor_spec(node: ort.NodeArg) -> TensorSpec:
    shape = tuple(dim if isinstance(dim, int) and dim >= 0 else None for dim in node.shape)
    dim_names = tuple(dim if isinstance(dim, str) and dim else None for dim in node.shape)
    return TensorSpec(node.name, ONNX_TO_V2.get(node.type, node.type), shape, dim_names)


@cache
def _probe_device(device: str, cuda_device_id: int) -> str:
    if device == "cpu" or "CUDAExecutionProvider" not in ort.get_available_providers():
        return _require_cpu_allowed(device)
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    probe.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = QUIET_SEVERITY
    ort.set_default_logger_severity(QUIET_SEVERITY)
    try:
        session = ort.InferenceSession(
            probe.SerializeToString(), options,
            providers=[("CUDAExecutionProvider", {"device_id": cuda_device_id}), "CPUExecutionProvider"],
        )
        is_cuda = session.get_providers()[0] == "CUDAExecutionProvider"
    except Exception as exc:  # ORT raises plain RuntimeError/Fail subclasses here
        logger.info("CUDA probe failed: %s", exc)
        is_cuda = False
    finally:
        ort.set_default_logger_severity(DEFAULT_SEVERITY)
    return f"cuda:{cuda_device_id}" if is_cuda else _require_cpu_allowed(device)


def _require_cpu_allowed(device: str) -> str:
    if device == "cuda":
        raise ConfigError("SERVING_DEVICE=cuda but the CUDA execution provider does not load here")
    return "cpu"


def resolve_device(config: ServingConfig) -> str:
    """`cuda:N` or `cpu`, decided once per process (the probe is cached)."""
    return _probe_device(config.device, config.cuda_device_id)


def session_options(config: ServingConfig) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = config.intra_op_threads
    options.inter_op_num_threads = config.inter_op_threads
    options.graph_optimization_level = GRAPH_OPTIMIZATION[config.graph_optimization]
    options.execution_mode = EXECUTION_MODE[config.execution_mode]
    options.enable_mem_pattern = config.memory_pattern
    # Spinning intra-op threads burn the cores the event loop needs between batches.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if config.allow_spinning else "0")
    # Fatal only: ONNX Runtime writes its own colour-coded lines to stderr, outside the JSON
    # log, one per failing run, and a client picks the inputs that fail. Every failure
    # reaches us as an exception anyway, answered and counted.
    options.log_severity_level = QUIET_SEVERITY
    run_memory.use_capped_arena(options, config.run_memory_mb)
    return options


def providers(config: ServingConfig, device: str) -> list:
    if not device.startswith("cuda:"):
        return ["CPUExecutionProvider"]
    cuda_options = {
        "device_id": config.cuda_device_id,
        "cudnn_conv_algo_search": CUDNN_SEARCH[config.cudnn_conv_algo_search],
    }
    if config.gpu_mem_limit_bytes:
        cuda_options["gpu_mem_limit"] = config.gpu_mem_limit_bytes
    return [("CUDAExecutionProvider", cuda_options), "CPUExecutionProvider"]



def c_ordered(array: np.ndarray) -> np.ndarray:
    """``array`` in C order, its shape kept: ``np.ascontiguousarray`` made a tensor of no
    dimensions one of shape [1], and ``np.require`` took 1.5 µs where this takes 0.2."""
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)  # a 0-d array is always contiguous

class Engine:
    """A loaded model: `run(inputs) -> outputs`, both in the model's declared order.

    Raises `serving.model_safety.UnsafeModel`, before ONNX Runtime sees the bytes,
    for a file with external data anywhere in it."""

    def __init__(self, model_bytes: bytes, config: ServingConfig, device: str):
        check_model_bytes(model_bytes)
        self.device = device
        self.session = ort.InferenceSession(model_bytes, session_options(config), providers=providers(config, device))
        self.inputs = tuple(tensor_spec(node) for node in self.session.get_inputs())
        self.outputs = tuple(tensor_spec(node) for node in self.session.get_outputs())
        self._input_names = [spec.name for spec in self.inputs]
        self._output_names = [spec.name for spec in self.outputs]
        self._cuda_device_id = config.cuda_device_id
        is_cuda = self.session.get_providers()[0] == "CUDAExecutionProvider"
        self.run = self._run_bound if is_cuda else self._run_plain

    @property
    def is_batchable(self) -> bool:
        """True when every input's first dimension is dynamic: that is the batch axis."""
        return all(spec.shape and spec.shape[0] is None for spec in self.inputs)

    def _run_plain(self, feeds: tuple[np.ndarray, ...]) -> list[np.ndarray]:
        return self.session.run(self._output_names, dict(zip(self._input_names, feeds)), current_options())

    def _run_bound(self, feeds: tuple[np.ndarray, ...]) -> list[np.ndarray]:
        # A binding per call: IOBinding objects are not safe to share across threads.
        binding = self.session.io_binding()
        for name, array in zip(self._input_names, feeds):
            binding.bind_cpu_input(name, c_ordered(array))
        for name in self._output_names:
            binding.bind_output(name, "cuda", self._cuda_device_id)
        self.session.run_with_iobinding(binding, current_options())
        return binding.copy_outputs_to_cpu()

    def example_inputs(self, rows: int) -> tuple[np.ndarray, ...]:
        """Zeros of every input for `rows` rows; other dynamic dimensions get size 1."""
        feeds = []
        for spec in self.inputs:
            dims = [rows if index == 0 and self.is_batchable else (dim or 1) for index, dim in enumerate(spec.shape)]
            feeds.append(np.zeros(dims, dtype=spec.dtype or np.float32))
        return tuple(feeds)

    def warm(self, max_batch_size: int, start: int = 1, timeout_s: float | None = None) -> list[tuple[int, float]]:
        """Run every batch size from `start` to `max_batch_size`, then time a few to seed
        the batcher's latency model. Returns (rows, seconds) samples. Past `timeout_s` the
        run under way is stopped (ONNX Runtime's RunOptions) and WarmTimedOut raised: a
        model that loops for ever at one batch size (its inspection ran others) held the
        worker's apply for good, and with it every later state, rollbacks included."""
        rows, began_s = start, time.monotonic()
        with stopped_after(timeout_s) as stop:
            run = stop.running(self.run)
            try:
                sizes = range(start, max_batch_size + 1) if self.is_batchable else [1]
                for rows in sizes:
                    run(self.example_inputs(rows))
                samples = []
                for rows in sorted({1, max(1, max(sizes) // 2), max(sizes)}):
                    feeds = self.example_inputs(rows)
                    for _ in range(3):
                        started_s = time.perf_counter()
                        run(feeds)
                        samples.append((rows, time.perf_counter() - started_s))
                return samples
            except Exception:
                if stop.stopped:
                    raise WarmTimedOut(rows, timeout_s, time.monotonic() - began_s) from None
                raise


class WarmTimedOut(Exception):
    """A warm-up that ran past its time; the run under way was stopped."""

    def __init__(self, rows: int, timeout_s: float, took_s: float):
        # How long it took said too: a run stops at the next node, so one long op runs on past the deadline.
        super().__init__(f"the warm-up ran past SERVING_WARM_TIMEOUT_S ({timeout_s:g} s) at batch size {rows}; its run was stopped "
                         f"{took_s:.1f} s after the warm-up began")
        self.rows = rows
