"""A loaded version: one engine, its dispatch threads and its per-shape batch queues.

This is what the traffic split routes to and what the data plane submits to. The
repository creates, warms, swaps and closes these; nothing here knows of desired states
or of HTTP.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

import orjson
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from serving import metrics, run_memory
from serving.batch_observer import BatchObserver
from serving.batch_policy import LatencyModel
from serving.batcher import Batcher
from serving.config import ServingConfig
from serving.contract import BatchPolicy
from serving.dispatch import DispatchThreads, EngineGate
from serving.engine import Engine
from serving.errors import BadRequest, DeadlineExceeded, ModelFailed, NotReady, QueueFull, ServingError
from serving.output_summary import OutputSummary
from serving.protocol import Decoded, ModelIO, v2_body_limit

if TYPE_CHECKING:  # a type only: the repository imports this module
    from serving.serving_plan import VersionSpec


class LoadedVersion:
    """An engine plus its per-shape batch queues; what the router routes to."""

    def __init__(self, spec: VersionSpec, engine: Engine, config: ServingConfig):
        self.spec = spec
        self.model_name, self.version = spec.model_name, spec.version
        self.engine = engine
        self.is_batchable = engine.is_batchable and is_declared_batchable(spec.signature)
        self.io = ModelIO(engine.inputs, engine.outputs, self.is_batchable, config.max_elements)
        self.policy = spec.policy if self.is_batchable else BatchPolicy(1, 0.0, spec.policy.max_queue_size, spec.policy.latency_target_s)
        self._max_body_bytes = config.max_body_bytes
        # The most bytes a V2 request can take here, known before its body is read (413 past it).
        self.body_limit = v2_body_limit(self.model_name, self.version, self.io, self.policy.max_batch_size, config.max_body_bytes)
        self.version_header = str(spec.version).encode()
        self.metrics = metrics.VersionMetrics(spec.model_name, spec.version)
        self.latency = LatencyModel()
        self._gate = EngineGate(config.max_batches_in_flight)
        # One long-lived thread per batch in flight, owned by this version (not a shared pool).
        self._dispatch = DispatchThreads(f"onnx-{spec.model_name}-v{spec.version}", config.max_batches_in_flight,
                                         config.compute_nice)
        self._max_shape_queues = config.max_shape_queues
        self._batchers: dict[tuple, Batcher] = {}
        self._observer = BatchObserver(spec.model_name, spec.version, self.metrics)
        # What this version answered, for the report; fed on the dispatch threads with each
        # batch the batchers run (the warm-up calls the engine directly and is not counted).
        self.output_summary = OutputSummary(engine.outputs)
        # Requests routed here and not answered yet, whether queued or still reading their
        # body: a retiring version's drain waits for each of them, not only for its queues.
        self._holders = 0
        self._released = asyncio.Event()
        self._released.set()
        self._closed = False

    def hold(self) -> None:
        """A request was routed here; `release()` once it is answered or failed."""
        self._holders += 1
        self._released.clear()

    def release(self) -> None:
        self._holders -= 1
        if not self._holders:
            self._released.set()

    def submit(self, decoded: Decoded, deadline_s: float, request_id: str, summarised: bool = True) -> asyncio.Future:
        """Queue a decoded request; ``summarised`` False (a pinned request) keeps its outputs
        out of this version's output summary."""
        if self._closed:  # past the drain's bound: fail now, never queue where nothing runs
            raise NotReady("this version was unloaded")
        batcher = self._batchers.get(decoded.shape_key) or self._new_batcher(decoded.shape_key)
        return batcher.submit(decoded.tensors, decoded.rows, deadline_s, request_id, summarised)

    def refusal(self, deadline_s: float) -> ServingError | None:
        """Why a one-row request would be refused by every queue of this version now, or
        None: asked before the body is read, so an overloaded worker does not pay for
        decoding what it will refuse (the shape, hence the queue, is not known yet)."""
        first = None
        for batcher in self._batchers.values():
            refusal = batcher.refusal(1, deadline_s)
            if refusal is None:
                return None  # one queue admits it: no need to ask the others
            first = first or refusal
        if isinstance(first, DeadlineExceeded):
            first.deadline_s = deadline_s  # whose deadline it is decides how the 504 is counted
        return first

    def _new_batcher(self, shape_key: tuple) -> Batcher:
        if len(self._batchers) >= self._max_shape_queues:
            self._reclaim_idle_queue()
        batcher = Batcher(self._run_engine, self.policy, self._dispatch, self._gate, self.latency,
                          observer=self._observer, is_batchable=self.is_batchable,
                          output_names=[spec.name for spec in self.io.outputs], classify_error=request_error,
                          summarise=self.output_summary.add)
        self._batchers[shape_key] = batcher
        return batcher

    def _reclaim_idle_queue(self) -> None:
        """Close the least recently used shape queue with nothing queued or running, so the
        limit bounds the shapes active at once, not every shape ever seen. Only an idle
        queue goes: no request and no dispatch-thread callback can still reach it."""
        idle = [(key, batcher) for key, batcher in self._batchers.items() if batcher.is_idle]
        if not idle:
            raise QueueFull(f"too many distinct input shapes in flight (limit {self._max_shape_queues})")
        key, batcher = min(idle, key=lambda item: item[1].last_arrival_s)
        del self._batchers[key]
        batcher.close()

    def _run_engine(self, feeds):
        # Looked up per call, so a run swapped on the engine (a test's hook) is the one called.
        return self.engine.run(feeds)

    def set_policy(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self.body_limit = v2_body_limit(self.model_name, self.version, self.io, policy.max_batch_size, self._max_body_bytes)
        for batcher in self._batchers.values():
            batcher.policy = policy

    @property
    def queue_depth(self) -> int:
        return sum(batcher.depth for batcher in self._batchers.values())

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every request routed here is answered; False if `timeout_s` passed first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._released.wait()
                results = await asyncio.gather(*(batcher.drain(timeout_s) for batcher in self._batchers.values()))
        except TimeoutError:
            return False
        return all(results)

    def close(self, forget_metrics: bool = True) -> None:
        """Unload. `forget_metrics=False` when another copy of this version is loaded (it was
        routed again while this one drained): the series are shared, and they are its now."""
        self._closed = True
        for batcher in self._batchers.values():
            batcher.close()
        self._batchers.clear()
        self._dispatch.close()
        if forget_metrics:
            self.metrics.remove()

    def metadata(self, versions: list[str] | None = None) -> dict:
        return {
            "name": self.model_name,
            "versions": versions or [str(self.version)],
            "platform": "onnxruntime_onnx",
            "inputs": [_tensor_metadata(spec) for spec in self.io.inputs],
            "outputs": [_tensor_metadata(spec) for spec in self.io.outputs],
        }


def _tensor_metadata(spec) -> dict:
    return {"name": spec.name, "datatype": spec.datatype, "shape": spec.metadata_shape}


def is_declared_batchable(signature: str) -> bool:
    """The console proved this version batchable at inspection (`"batchable": true`).

    A missing flag means not batchable: a dynamic first dimension alone does not show that
    a model keeps rows apart (it may reduce over them), so an unproven version runs each
    request alone rather than risk answering one client with another's rows."""
    declared = orjson.loads(signature)
    return isinstance(declared, dict) and declared.get("batchable") is True


# What ONNX Runtime's kernels say (as FAIL, not INVALID_ARGUMENT) when two tensors' shapes
# disagree: inputs whose dimensions the signature leaves free and names apart (or not at
# all) but the graph combines. Counted as the version's, any client could fail a canary.
# tests/serving/test_shared_dimensions.py runs each against the installed ONNX Runtime.
KERNEL_SHAPE_MISMATCHES = (
    "Attempting to broadcast an axis by a dimension other than 1",  # element-wise ops
    "MatMul dimension mismatch",
    "Non concat axis dimensions must match",
)


def request_error(error: Exception) -> ServingError:
    """The answer to a request whose run failed on its own. ONNX Runtime's INVALID_ARGUMENT
    (an index out of range, a dimension the graph refuses), or a kernel finding two of its
    tensors' shapes disagree, is about this input: 400. A run short of the capped run
    memory is 413 or 503 (serving/run_memory.py). Any other failure is the model's: 500,
    with the details in the log only."""
    refused_for_memory = run_memory.refusal(error)
    if refused_for_memory is not None:
        return refused_for_memory
    if isinstance(error, ort_errors.InvalidArgument):
        return BadRequest(f"the model refused this input: {_ort_reason(error)}")
    mismatch = _kernel_shape_mismatch(error) if isinstance(error, ort_errors.Fail) else None
    if mismatch is not None:
        return BadRequest(f"the model refused these inputs' shapes: {mismatch}")
    return ModelFailed("model execution failed")


def _kernel_shape_mismatch(error: Exception) -> str | None:
    """The kernel's own words from the phrase on (its source path and C++ signature are no
    client's business), after the node's operator: "Mul node: Attempting … 3 by 5"."""
    message = str(error)
    for said in KERNEL_SHAPE_MISMATCHES:
        start = message.find(said)
        if start >= 0:
            node = re.search(r"running (\w+) node", message)
            return (f"{node.group(1)} node: " if node else "") + message[start:start + 160].strip()
    return None


def _ort_reason(error: Exception) -> str:
    message = str(error)
    for marker in ("Status Message: ", "INVALID_ARGUMENT : "):
        if marker in message:
            message = message.split(marker, 1)[1]
            break
    return message[:160]
