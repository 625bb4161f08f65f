"""The loaded versions, and `apply(desired_state)` that converges on the console's state.

Converging: fetch and verify each new version's artifact, load and warm it
(`serving.version_loader`), *then* swap the routing table (one reference assignment),
then ack, while versions neither routed nor kept warm drain and unload in the background.
If anything fails to load,
nothing is swapped: the previous routes keep serving and the result says why.
Once the loaded versions changed, the cache drops artifacts nothing needs any more
(serving/artifact_cache.py says what it always keeps).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from types import MappingProxyType

from serving import metrics
from serving.artifact_cache import evict_unused_artifacts
from serving.config import ServingConfig
from serving.contract import BatchPolicy, ContractError
from serving.errors import LoadError
from serving.loaded_version import LoadedVersion
from serving.logs import event
from serving.serving_plan import ServingPlan, parse_state
from serving.traffic_split import Router, RoutingTable, build_routes
from serving.version_loader import FetchFn, load_version, warm_in_time

logger = logging.getLogger("serving.repository")


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
    # Why nothing is served, once that is known (a refusal's 503 says it); None while the first state loads.
    not_ready_reason: str | None = None
    _loaded: dict = field(default_factory=dict)  # (model, version) -> LoadedVersion
    _desired: ServingPlan | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _retiring: set = field(default_factory=set)  # drain-then-close tasks of retired versions

    @property
    def loaded(self) -> MappingProxyType:
        return MappingProxyType(self._loaded)

    async def apply(self, state: object) -> dict:
        """Converge on `state`; returns {generation, ok, error?, load_ms} for the ack."""
        async with self._lock:
            started_s = time.perf_counter()
            result = await self._apply(state)
            result.load_ms = (time.perf_counter() - started_s) * 1000
            if result.ok:
                metrics.STATE_GENERATION.set(result.generation)
            elif not self.is_ready:
                self.serve_nothing_because(f"the state of generation {result.generation} could not be applied")
            log = logger.info if result.ok else logger.error
            log(event("state_applied" if result.ok else "state_not_applied", **result.as_dict()))
            return result.as_dict()

    async def _apply(self, state: object) -> ApplyResult:
        try:
            generation, desired = parse_state(state, self.config)
        except ContractError as exc:
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
        self._retire_after_the_ack(retired)
        served = {version.spec.sha256 for version in loaded.values()}
        await asyncio.to_thread(evict_unused_artifacts, self.config.cache_dir, served)
        return ApplyResult(generation, True)

    def serve_nothing_because(self, *failures: str) -> None:
        """Say, in every 503 until a state applies, why there is nothing to serve. Kept to
        what failed; the details (paths, addresses) are in the worker's log, not in answers
        to clients."""
        self.not_ready_reason = f"no state applied: {', and '.join(failures)}; the worker's log says why"

    def _set_generation(self, generation: int) -> None:
        if generation != self.generation:
            self.generation = generation
            self.router.swap(self._table(generation, self._desired))

    async def _converge_versions(self, desired: ServingPlan) -> dict:
        """Every desired version loaded and warm; on failure, unload what this call loaded."""
        loaded, fresh, policies = {}, [], []
        try:
            for spec in desired.versions:
                current = self._loaded.get(spec.key)
                if current is not None and current.spec.sha256 == spec.sha256:
                    await self._warm_for(current, spec.policy)
                    policies.append((current, spec.policy))
                    loaded[spec.key] = current
                else:
                    loaded[spec.key] = await load_version(spec, self.config, self.device, self.fetch)
                    fresh.append(loaded[spec.key])
        except LoadError:
            for version in fresh:
                version.close()
            raise
        # Only once every version is in: a failed apply leaves the served batching as it was.
        for version, policy in policies:
            if version.is_batchable and policy != version.policy:
                version.set_policy(policy)
        for key in desired.warm_keys:
            if key in self._loaded:
                loaded[key] = self._loaded[key]
            else:
                logger.warning("%s v%s: listed warm but not loaded here and no artifact given; skipped", *key)
        return loaded

    async def _warm_for(self, version: LoadedVersion, policy: BatchPolicy) -> None:
        """Warm the batch sizes a larger ``max_batch_size`` adds before they are routed. A
        size that fails to run (out of memory) fails the apply like a version that fails
        to load: the worker acks the failure and serves what it served."""
        if not version.is_batchable or policy.max_batch_size <= version.policy.max_batch_size:
            return
        try:
            await warm_in_time(version, policy.max_batch_size, version.policy.max_batch_size + 1, self.config.warm_timeout_s)
        except LoadError:
            raise
        except Exception as error:  # noqa: BLE001 - ONNX Runtime raises its own kinds
            raise LoadError(f"{version.model_name} v{version.version}: batches of up to {policy.max_batch_size} rows "
                            f"failed to run: {type(error).__name__}: {str(error)[:200]}") from None

    def _table(self, generation: int, desired: ServingPlan) -> RoutingTable:
        models = {}
        shadows = dict(desired.shadows)
        for model_name, weights in desired.weights:
            targets = {version: loaded for (name, version), loaded in self._loaded.items() if name == model_name}
            models[model_name] = build_routes(dict(weights), targets, shadows.get(model_name, ()))
        return RoutingTable(generation, MappingProxyType(models), self.config.allow_pinning_unrouted)

    def _retire_after_the_ack(self, retired: list[LoadedVersion]) -> None:
        """Drain and unload in the background. The new routes serve from the swap; a retired
        version's drain waits for every request routed to it, a slow client's body included,
        up to SERVING_DRAIN_TIMEOUT_S, and must hold neither this ack nor the next apply."""
        for version in retired:
            task = asyncio.get_running_loop().create_task(self._retire(version))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, version: LoadedVersion) -> None:
        try:
            if not await version.drain(self.config.drain_timeout_s):
                logger.warning("%s v%s: drain timed out; failing what is left", version.model_name, version.version)
        finally:
            version.close(forget_metrics=(version.model_name, version.version) not in self._loaded)

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
        retiring = list(self._retiring)
        for task in retiring:
            task.cancel()  # each closes its version on the way out
        await asyncio.gather(*retiring, return_exceptions=True)
        for version in self._loaded.values():
            version.close()
        self._loaded.clear()
        metrics.LOADED_VERSIONS.set(0)
