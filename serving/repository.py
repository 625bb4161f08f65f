"""Loaded versions, and `apply(desired_state)` that converges on the console's state.

Converging: fetch and verify each new version's artifact, load and warm it, *then* swap
the routing table (one reference assignment), then drain and unload versions neither
routed nor kept warm. If anything fails to load, nothing is swapped: the previous
routes keep serving and the result says why.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import orjson
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from serving import contract, metrics
from serving.batcher import Batcher, BatchObserver, DispatchThreads, EngineGate, LatencyModel, lower_priority
from serving.config import ServingConfig
from serving.console_client import ArtifactError, ArtifactRefused, artifact_location
from serving.contract import BatchPolicy, ContractError
from serving.engine import Engine
from serving.errors import BadRequest, LoadError, ModelFailed, QueueFull, ServingError
from serving.model_safety import UnsafeModel
from serving.protocol import Decoded, ModelIO
from serving.router import Router, RoutingTable, build_routes

logger = logging.getLogger("serving.repository")

ORT_ERRORS = (ort_errors.Fail, ort_errors.InvalidArgument, ort_errors.InvalidProtobuf, ort_errors.InvalidGraph,
              ort_errors.NoSuchFile, ort_errors.NotImplemented, ort_errors.RuntimeException, RuntimeError)
FetchFn = Callable[[str, str, Path], Path]  # (artifact_url, sha256, cache path) -> verified file


# One exception type for a state this worker cannot apply, the contract's refusals and
# its own alike (the name Repository._apply catches).
StateInvalid = ContractError


# ---- desired state --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VersionSpec:
    """What this worker loads for one version: the contract's route or warm entry with
    the artifact's location resolved, and the model's batching."""

    model_name: str
    version: int
    sha256: str
    artifact_url: str
    signature: str  # canonical JSON, so specs compare by value
    policy: BatchPolicy

    @property
    def key(self) -> tuple[str, int]:
        return self.model_name, self.version


@dataclass(frozen=True, slots=True)
class DesiredState:
    """What this worker serves, derived from a parsed ``contract.DesiredState``. Compared
    with the one applied: a new generation of the same content only bumps the generation."""

    versions: tuple[VersionSpec, ...]  # routed and warm ones, each once
    warm_keys: tuple[tuple[str, int], ...]  # warm by number only: kept if loaded, never fetched
    weights: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]  # model -> ((version, weight), ...)
    shadows: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()  # model -> ((version, fraction), ...)


def parse_state(state: object, config: ServingConfig) -> tuple[int, DesiredState]:
    """The contract's parse (every shape check, the contract version first; batching left
    out takes this worker's settings), then this worker's own check: artifact URLs on the
    console's origin. ContractError names the offending field."""
    defaults = BatchPolicy(config.max_batch_size, config.max_queue_delay_s, config.max_queue_size)
    desired = contract.DesiredState.parse(state, batching_defaults=defaults)
    specs, warm_keys, weights, shadows = [], [], [], []
    for model_name, model in sorted(desired.models.items()):
        model_specs = _version_specs(model_name, model, config)
        specs.extend(model_specs.values())
        warm_keys.extend((model_name, entry.version) for entry in model.warm if entry.version not in model_specs)
        weights.append((model_name, tuple((route.version, route.weight) for route in model.routes)))
        shadows.append((model_name, tuple((route.version, float(route.shadow)) for route in model.routes if route.shadow is not None)))
    return desired.generation, DesiredState(tuple(specs), tuple(warm_keys), tuple(weights), tuple(shadows))


def _version_specs(model_name: str, model: contract.ModelState, config: ServingConfig) -> dict[int, VersionSpec]:
    """Routed versions, then warm ones given whole (a worker that never saw them can
    still load them), each once."""
    specs: dict[int, VersionSpec] = {}
    for index, route in enumerate(model.routes):
        specs[route.version] = _version_spec(model_name, route, f"models.{model_name}.routes[{index}]", model.batching, config)
    for index, entry in enumerate(model.warm):
        if entry.is_fetchable:
            specs.setdefault(entry.version, _version_spec(model_name, entry, f"models.{model_name}.warm[{index}]", model.batching, config))
    return specs


def _version_spec(model_name: str, entry: contract.Route | contract.WarmVersion, path: str, policy: BatchPolicy,
                  config: ServingConfig) -> VersionSpec:
    try:
        # Judged here, before anything is fetched: a refused URL fails the whole state.
        location = artifact_location(entry.artifact_url, config.console_url, allow_local=config.allow_local_artifacts)
    except ArtifactRefused as refusal:
        raise ContractError(f"{path}.artifact_url", str(refusal)) from None
    return VersionSpec(model_name, entry.version, entry.sha256, location,
                       orjson.dumps(entry.signature, option=orjson.OPT_SORT_KEYS).decode(), policy)


# ---- a loaded version -----------------------------------------------------------------


class LoadedVersion:
    """An engine plus its per-shape batch queues; what the router routes to."""

    def __init__(self, spec: VersionSpec, engine: Engine, config: ServingConfig, executor: Executor):
        self.spec = spec
        self.model_name, self.version = spec.model_name, spec.version
        self.engine = engine
        self.is_batchable = engine.is_batchable and is_declared_batchable(spec.signature)
        self.io = ModelIO(engine.inputs, engine.outputs, self.is_batchable, config.max_elements)
        self.policy = spec.policy if self.is_batchable else BatchPolicy(1, 0.0, spec.policy.max_queue_size, spec.policy.latency_target_s)
        self.version_header = str(spec.version).encode()
        self.metrics = metrics.VersionMetrics(spec.model_name, spec.version)
        self.latency = LatencyModel()
        self._gate = EngineGate(config.max_batches_in_flight)
        # One long-lived thread per batch in flight, owned by this version (not a shared pool).
        self._dispatch = None
        if config.dispatch == "thread":
            self._dispatch = DispatchThreads(f"onnx-{spec.model_name}-v{spec.version}", config.max_batches_in_flight,
                                             config.compute_nice)
        self._executor = self._dispatch or executor
        self._max_shape_queues = config.max_shape_queues
        self._inline_max_s = config.inline_batch_max_s
        self._batchers: dict[tuple, Batcher] = {}
        self._observer = BatchObserver(spec.model_name, spec.version, self.metrics)

    def submit(self, decoded: Decoded, deadline_s: float, request_id: str) -> asyncio.Future:
        batcher = self._batchers.get(decoded.shape_key) or self._new_batcher(decoded.shape_key)
        return batcher.submit(decoded.tensors, decoded.rows, deadline_s, request_id)

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
        return first

    def _new_batcher(self, shape_key: tuple) -> Batcher:
        if len(self._batchers) >= self._max_shape_queues:
            self._reclaim_idle_queue()
        batcher = Batcher(self.engine.run, self.policy, self._executor, self._gate, self.latency,
                          observer=self._observer, inline_max_s=self._inline_max_s, is_batchable=self.is_batchable,
                          output_names=[spec.name for spec in self.io.outputs], classify_error=request_error)
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

    def set_policy(self, policy: BatchPolicy) -> None:
        self.policy = policy
        for batcher in self._batchers.values():
            batcher.policy = policy

    @property
    def queue_depth(self) -> int:
        return sum(batcher.depth for batcher in self._batchers.values())

    async def drain(self, timeout_s: float) -> bool:
        results = await asyncio.gather(*(batcher.drain(timeout_s) for batcher in self._batchers.values()))
        return all(results)

    def close(self) -> None:
        for batcher in self._batchers.values():
            batcher.close()
        self._batchers.clear()
        if self._dispatch is not None:
            self._dispatch.close()
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


# ---- the repository -------------------------------------------------------------------


@dataclass
class ApplyResult:
    generation: int
    ok: bool
    load_ms: float = 0.0
    error: str | None = None

    def as_dict(self) -> dict:
        result = {"generation": self.generation, "ok": self.ok, "load_ms": round(self.load_ms, 1)}
        if self.error is not None:
            result["error"] = self.error
        return result


@dataclass
class Repository:
    config: ServingConfig
    device: str
    fetch: FetchFn
    executor: Executor
    router: Router = field(default_factory=Router)
    generation: int | None = None
    is_ready: bool = False
    _loaded: dict = field(default_factory=dict)  # (model, version) -> LoadedVersion
    _desired: DesiredState | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def loaded(self) -> MappingProxyType:
        return MappingProxyType(self._loaded)

    async def apply(self, state: object) -> dict:
        """Converge on `state`; returns {generation, ok, error?, load_ms} for the ack."""
        async with self._lock:
            started_s = time.perf_counter()
            result = await self._apply(state)
            result.load_ms = (time.perf_counter() - started_s) * 1000
            log = logger.info if result.ok else logger.error
            log("apply generation %s: %s", result.generation, result.as_dict())
            return result.as_dict()

    async def _apply(self, state: object) -> ApplyResult:
        try:
            generation, desired = parse_state(state, self.config)
        except StateInvalid as exc:
            raw = state.get("generation") if isinstance(state, dict) else None
            return ApplyResult(raw if type(raw) is int else -1, False, error=str(exc))
        if desired == self._desired:
            self._set_generation(generation)
            return ApplyResult(generation, True)
        try:
            loaded = await self._converge_versions(desired)
        except LoadError as exc:
            return ApplyResult(generation, False, error=str(exc))
        retired = [version for key, version in self._loaded.items() if loaded.get(key) is not version]
        self._loaded, self._desired, self.generation = loaded, desired, generation
        self.router.swap(self._table(generation, desired))
        self.is_ready = True
        metrics.LOADED_VERSIONS.set(len(loaded))
        await self._retire(retired)
        return ApplyResult(generation, True)

    def _set_generation(self, generation: int) -> None:
        if generation != self.generation:
            self.generation = generation
            self.router.swap(self._table(generation, self._desired))

    async def _converge_versions(self, desired: DesiredState) -> dict:
        """Every desired version loaded and warm; on failure, unload what this call loaded."""
        loaded, fresh = {}, []
        try:
            for spec in desired.versions:
                current = self._loaded.get(spec.key)
                if current is not None and current.spec.sha256 == spec.sha256:
                    await self._update_policy(current, spec.policy)
                    loaded[spec.key] = current
                else:
                    loaded[spec.key] = await self._load(spec)
                    fresh.append(loaded[spec.key])
        except LoadError:
            for version in fresh:
                version.close()
            raise
        for key in desired.warm_keys:
            if key in self._loaded:
                loaded[key] = self._loaded[key]
            else:
                logger.warning("%s v%s: listed warm but not loaded here and no artifact given; skipped", *key)
        return loaded

    async def _load(self, spec: VersionSpec) -> LoadedVersion:
        loop = asyncio.get_running_loop()
        try:
            model_bytes = await loop.run_in_executor(None, self._fetch_verified, spec)
            engine = await loop.run_in_executor(None, _build_engine, model_bytes, self.config, self.device)
            _check_signature(spec, engine)
            version = LoadedVersion(spec, engine, self.config, self.executor)
            try:
                samples = await loop.run_in_executor(None, engine.warm, version.policy.max_batch_size)
            except BaseException:
                version.close()
                raise
        except (ArtifactError, OSError) as exc:
            raise LoadError(f"{spec.model_name} v{spec.version}: {exc}") from None
        except UnsafeModel as exc:  # the worker's own check, before any session exists
            raise LoadError(f"{spec.model_name} v{spec.version}: refused to load the model: {exc.reason}") from None
        except ORT_ERRORS as exc:
            raise LoadError(f"{spec.model_name} v{spec.version}: ONNX Runtime refused the model: {exc}") from None
        for rows, seconds in samples:
            version.latency.observe(rows, seconds)
        return version

    def _fetch_verified(self, spec: VersionSpec) -> bytes:
        path = self.fetch(spec.artifact_url, spec.sha256, Path(self.config.cache_dir) / f"{spec.sha256}.onnx")
        model_bytes = path.read_bytes()
        # Hash what we load, not just what we fetched: the file could change in between.
        if hashlib.sha256(model_bytes).hexdigest() != spec.sha256:
            raise ArtifactError(f"sha256 of {path} changed after verification")
        return model_bytes

    async def _update_policy(self, version: LoadedVersion, policy: BatchPolicy) -> None:
        if not version.is_batchable or policy == version.policy:
            return
        if policy.max_batch_size > version.policy.max_batch_size:  # warm the new sizes first
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, version.engine.warm, policy.max_batch_size, version.policy.max_batch_size + 1)
        version.set_policy(policy)

    def _table(self, generation: int, desired: DesiredState) -> RoutingTable:
        models = {}
        shadows = dict(desired.shadows)
        for model_name, weights in desired.weights:
            targets = {version: loaded for (name, version), loaded in self._loaded.items() if name == model_name}
            models[model_name] = build_routes(dict(weights), targets, shadows.get(model_name, ()))
        return RoutingTable(generation, MappingProxyType(models), self.config.allow_pinning_unrouted)

    async def _retire(self, retired: list[LoadedVersion]) -> None:
        for version in retired:
            if not await version.drain(self.config.drain_timeout_s):
                logger.warning("%s v%s: drain timed out; failing what is left", version.model_name, version.version)
            version.close()

    # ---- read side for /health and metadata -----------------------------------------

    def versions_of(self, model_name: str) -> list[LoadedVersion]:
        return sorted((v for (name, _), v in self._loaded.items() if name == model_name), key=lambda v: v.version)

    def health(self) -> dict:
        table = self.router.table
        return {
            "status": "ready" if self.is_ready else "loading",
            "device": self.device,
            "generation": self.generation,
            "models": {
                name: {
                    "routes": [{"version": v, "weight": w} for v, w in zip(routes.versions, routes.weights)],
                    "loaded": sorted(routes.targets),
                    "queue_depth": {str(v): t.queue_depth for v, t in routes.targets.items()},
                }
                for name, routes in table.models.items()
            },
        }

    async def close(self) -> None:
        for version in self._loaded.values():
            version.close()
        self._loaded.clear()
        metrics.LOADED_VERSIONS.set(0)


def _build_engine(model_bytes: bytes, config: ServingConfig, device: str) -> Engine:
    """The session, created in a thread at the compute priority when SERVING_COMPUTE_NICE
    is set: ONNX Runtime's intra-op threads start with (inherit) the creator's priority."""
    if config.compute_nice <= 0:
        return Engine(model_bytes, config, device)
    outcome: dict = {}

    def build() -> None:
        lower_priority(config.compute_nice)
        try:
            outcome["engine"] = Engine(model_bytes, config, device)
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=build, name="onnx-load")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["engine"]


def is_declared_batchable(signature: str) -> bool:
    """The console proved this version batchable at inspection (`"batchable": true`).

    A missing flag means not batchable: a dynamic first dimension alone does not show that
    a model keeps rows apart (it may reduce over them), so an unproven version runs each
    request alone rather than risk answering one client with another's rows."""
    declared = orjson.loads(signature)
    return isinstance(declared, dict) and declared.get("batchable") is True


def request_error(error: Exception) -> ServingError:
    """The answer to a request whose run failed on its own. ONNX Runtime's INVALID_ARGUMENT
    (an index out of range, a dimension the graph refuses) is about this input: 400. Any
    other failure is the model's: 500, with the details in the log only."""
    if isinstance(error, ort_errors.InvalidArgument):
        return BadRequest(f"the model refused this input: {_ort_reason(error)}")
    return ModelFailed("model execution failed")


def _ort_reason(error: Exception) -> str:
    message = str(error)
    for marker in ("Status Message: ", "INVALID_ARGUMENT : "):
        if marker in message:
            message = message.split(marker, 1)[1]
            break
    return message[:160]


def _check_signature(spec: VersionSpec, engine: Engine) -> None:
    """The console's signature, when given, must name the model's own inputs and outputs."""
    signature = orjson.loads(spec.signature)
    for side, actual in (("inputs", engine.inputs), ("outputs", engine.outputs)):
        declared = signature.get(side) if isinstance(signature, dict) else None
        if not declared:
            continue
        declared_names = [item.get("name") for item in declared if isinstance(item, dict)]
        actual_names = [tensor.name for tensor in actual]
        if declared_names != actual_names:
            raise LoadError(f"{spec.model_name} v{spec.version}: signature {side} {declared_names} "
                            f"do not match the model's {actual_names}")
