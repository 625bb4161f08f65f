"""The loaded versions, and `apply(desired_state)` that converges on the console's state.

Converging: fetch and verify each new version's artifact, load and warm it
(`serving.version_loader`), *then* swap the routing table (one reference assignment),
then drain and unload versions neither routed nor kept warm. If anything fails to load,
nothing is swapped: the previous routes keep serving and the result says why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from types import MappingProxyType

import orjson

from serving import metrics
from serving.batcher import BatchPolicy
from serving.config import ServingConfig
from serving.console_client import ArtifactRefused, artifact_location
from serving.errors import LoadError
from serving.loaded_version import LoadedVersion
from serving.state_signing import is_hex64
from serving.traffic_split import Router, RoutingTable, build_routes
from serving.version_loader import FetchFn, load_version

logger = logging.getLogger("serving.repository")


class StateInvalid(ValueError):
    """The desired state does not follow the contract in docs/architecture.md."""


# ---- desired state --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VersionSpec:
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
    versions: tuple[VersionSpec, ...]  # routed and warm ones, each once
    warm_keys: tuple[tuple[str, int], ...]  # warm by number only: kept if loaded, never fetched
    weights: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]  # model -> ((version, weight), ...)
    shadows: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()  # model -> ((version, fraction), ...)


def parse_state(state: object, config: ServingConfig) -> tuple[int, DesiredState]:
    if not isinstance(state, dict) or type(state.get("generation")) is not int:
        raise StateInvalid("state needs an integer 'generation'")
    models = state.get("models")
    if not isinstance(models, dict):
        raise StateInvalid("state needs a 'models' object")
    specs, warm_keys, weights, shadows = [], [], [], []
    for model_name, model in sorted(models.items()):
        model_specs, model_warm, model_weights = _parse_model(model_name, model, config)
        specs.extend(model_specs)
        warm_keys.extend((model_name, version) for version in model_warm)
        weights.append((model_name, model_weights))
        shadows.append((model_name, _shadows(model_name, model)))
    return state["generation"], DesiredState(tuple(specs), tuple(warm_keys), tuple(weights), tuple(shadows))


def _shadows(model_name: str, model: dict) -> tuple[tuple[int, float], ...]:
    """Routes with a ``shadow`` fraction: mirrored after the answer, never answering."""
    found = []
    for route in model.get("routes", []):
        fraction = route.get("shadow")
        if fraction is None:
            continue
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise StateInvalid(f"model '{model_name}' version {route.get('version')}: shadow must be a fraction in (0, 1]")
        found.append((route["version"], float(fraction)))
    return tuple(found)


def _parse_model(model_name: str, model: object, config: ServingConfig):
    if not isinstance(model, dict) or not isinstance(model.get("routes", []), list):
        raise StateInvalid(f"model '{model_name}': needs a 'routes' list")
    policy = _policy(model_name, model.get("batching") or {}, config)
    specs, warm, weights = {}, [], []
    for route in model.get("routes", []):
        spec = _version_spec(model_name, route, policy, config)
        weight = route.get("weight", 0)
        if type(weight) is not int or not 0 <= weight <= 100:
            raise StateInvalid(f"model '{model_name}' version {spec.version}: weight must be an integer 0..100")
        specs[spec.version] = spec
        weights.append((spec.version, weight))
    for entry in model.get("warm", []) or []:
        # Contract lists warm versions by number; an entry may also be a full route
        # object, so a worker that never saw that version can still load it.
        if isinstance(entry, dict):
            spec = _version_spec(model_name, entry, policy, config)
            specs.setdefault(spec.version, spec)
        elif type(entry) is int:
            warm.append(entry)
        else:
            raise StateInvalid(f"model '{model_name}': 'warm' entries must be version numbers or route objects")
    return tuple(specs.values()), tuple(v for v in warm if v not in specs), tuple(weights)


def _version_spec(model_name: str, route: object, policy: BatchPolicy, config: ServingConfig) -> VersionSpec:
    if not isinstance(route, dict):
        raise StateInvalid(f"model '{model_name}': each route must be an object")
    version, sha256, url = route.get("version"), route.get("sha256"), route.get("artifact_url")
    if type(version) is not int or not is_hex64(sha256) or not isinstance(url, str):
        raise StateInvalid(f"model '{model_name}': each route needs version (int), sha256 (64 lowercase hex), artifact_url")
    try:
        # Judged here, before anything is fetched: a refused URL fails the whole state.
        location = artifact_location(url, config.console_url, allow_local=config.allow_local_artifacts)
    except ArtifactRefused as refusal:
        raise StateInvalid(f"model '{model_name}' version {version}: {refusal}") from None
    signature = route.get("signature") or {}
    return VersionSpec(model_name, version, sha256, location,
                       orjson.dumps(signature, option=orjson.OPT_SORT_KEYS).decode(), policy)


def _policy(model_name: str, batching: object, config: ServingConfig) -> BatchPolicy:
    if not isinstance(batching, dict):
        raise StateInvalid(f"model '{model_name}': 'batching' must be an object")
    try:
        policy = BatchPolicy(
            max_batch_size=int(batching.get("max_batch_size") or config.max_batch_size),
            max_queue_delay_s=float(batching.get("max_queue_delay_s", config.max_queue_delay_s)),
            max_queue_size=int(batching.get("max_queue_size") or config.max_queue_size),
            latency_target_s=None if batching.get("latency_target_s") is None else float(batching["latency_target_s"]),
        )
    except (TypeError, ValueError):
        raise StateInvalid(f"model '{model_name}': batching values must be numbers") from None
    if policy.max_batch_size < 1 or policy.max_queue_size < 1 or policy.max_queue_delay_s < 0:
        raise StateInvalid(f"model '{model_name}': batching values out of range")
    return policy


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
                    loaded[spec.key] = await load_version(spec, self.config, self.device, self.fetch)
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
