"""The loaded versions, and `apply(desired_state)` that converges on the console's state.

Converging: fetch and verify each new version's artifact, load and warm it
(`serving.version_loader`), *then* swap the routing table (one reference assignment),
then ack, while versions neither routed nor kept warm drain and unload in the background.
Models converge one by one: a model whose version fails to load (or to warm in time)
keeps its previous routes and versions, and the other models' changes are swapped in
anyway, so one broken canary never holds another model's rollback. A failing model that
was served nothing before serves its versions that loaded (their weights scaled to sum
to 100), or, with none routed, answers 503 naming it. The result is then not ok, names
what failed and which models failed (``kept``), and ``applied_state`` is the state
actually served: the console's, with those
models' entries taken from the state applied before (or reduced to what loaded). When
nothing but failing models changed, the routes and the state served stay as they were;
when the others' entries changed but not their routes, the state served and its
generation change, the routes do not.
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
from serving.contract import PARTLY_APPLIED, BatchPolicy, ContractError
from serving.errors import LoadError
from serving.loaded_version import LoadedVersion
from serving.logs import event
from serving.serving_plan import ServingPlan, parse_state
from serving.state_signing import content_of
from serving.traffic_split import Router, RoutingTable, build_routes, unavailable_routes
from serving.version_loader import FetchFn, load_version, warm_in_time

logger = logging.getLogger("serving.repository")


# ---- the repository -------------------------------------------------------------------


# How a failing model is served, as the ack says after "applied but for <model>".
SERVED_AS = {"before": "keeps the routes it served before", "in part": "serves only its versions that loaded",
             "absent": "not served here: it was not before"}


def without_versions(entry: dict, versions) -> dict:
    """A model's entry of a state with ``versions`` neither routed nor kept warm. The routed
    versions left share all the traffic, so their weights are scaled to sum to 100 again:
    the entry is what the worker serves and says (`/v2/models`, `/health`, the digest), and
    a stable at 90 beside a 10 % canary that failed to load serves 100, not 90."""
    warm = [item for item in entry.get("warm", []) if (item["version"] if isinstance(item, dict) else item) not in versions]
    return {**entry, "routes": _scaled_to_100([route for route in entry["routes"] if route["version"] not in versions]), "warm": warm}


def _scaled_to_100(routes: list[dict]) -> list[dict]:
    """``routes`` with their weights scaled to sum to 100 in whole percents (largest
    remainder first, ties to the earlier route); a weight of 0 (a shadow) stays 0."""
    total = sum(route["weight"] for route in routes)
    if total in (0, 100):
        return routes
    weights = [route["weight"] * 100 // total for route in routes]
    by_remainder = sorted(range(len(routes)), key=lambda index: (-(routes[index]["weight"] * 100 % total), index))
    for index in by_remainder[:100 - sum(weights)]:
        weights[index] += 1
    return [{**route, "weight": weight} for route, weight in zip(routes, weights)]


def _close_all_but(versions, kept) -> None:
    """Close each of ``versions`` that is not one of ``kept`` (by identity: a version
    loaded again is another object)."""
    keep = {id(version) for version in kept}
    for version in versions:
        if id(version) not in keep:
            version.close()


def _set_policies(policies: list) -> None:
    """Each kept version's new batching ((version, policy) pairs)."""
    for version, policy in policies:
        if version.is_batchable and policy != version.policy:
            version.set_policy(policy)


def with_entries_from(state: dict, earlier: dict | None, names) -> dict:
    """``state`` with the models ``names`` as ``earlier`` had them: absent where it had
    none, or where it is of another epoch (another database's entry, which this console
    never issued, would be served and reported as of its epoch)."""
    same_epoch = earlier is not None and earlier.get("epoch") == state.get("epoch")
    before = earlier.get("models", {}) if same_epoch else {}
    models = {name: entry for name, entry in state["models"].items() if name not in names}
    models.update({name: before[name] for name in names if name in before})
    return {**state, "models": models}


@dataclass
class ApplyResult:
    generation: int
    ok: bool
    load_ms: float = 0.0
    error: str | None = None
    kept: tuple[str, ...] = ()  # models left on their previous routes while the others' changes applied

    def as_dict(self) -> dict:
        result = {"generation": self.generation, "ok": self.ok, "load_ms": round(self.load_ms, 1)}
        if self.error is not None:
            result["error"] = self.error
        if self.kept:
            result["kept"] = list(self.kept)
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
    # The state served, as received (or, after a partial apply, with the failing models'
    # entries from the state before): what the control plane digests, reports and persists.
    applied_state: dict | None = None
    # Models the console routes that have nothing served here (their versions failed): a 503 each.
    _unavailable: tuple[str, ...] = ()
    # The last apply's outcome for /health (generation, ok, and the models kept apart), never
    # its error: that may name paths and addresses, which stay in the worker's log.
    last_apply: dict | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _retiring: set = field(default_factory=set)  # drain-then-close tasks of retired versions

    @property
    def loaded(self) -> MappingProxyType:
        return MappingProxyType(self._loaded)

    async def apply(self, state: object) -> dict:
        """Converge on `state`; returns {generation, ok, error?, kept?, load_ms} for the ack
        (``kept``: the models that failed and kept what they served, the rest applied)."""
        async with self._lock:
            started_s = time.perf_counter()
            result = await self._apply(state)
            result.load_ms = (time.perf_counter() - started_s) * 1000
            if self.generation is not None:
                metrics.STATE_GENERATION.set(self.generation)
            if not result.ok and not self.is_ready:
                self.serve_nothing_because(f"the state of generation {result.generation} could not be applied")
            self.last_apply = {"generation": result.generation, "ok": result.ok, "kept": list(result.kept)}
            log = logger.info if result.ok else logger.error
            name = "state_applied" if result.ok else "state_partly_applied" if result.kept else "state_not_applied"
            log(event(name, **result.as_dict()))
            return result.as_dict()

    async def _apply(self, state: object) -> ApplyResult:
        try:
            generation, desired = parse_state(state, self.config)
        except ContractError as exc:
            raw = state.get("generation") if isinstance(state, dict) else None
            return ApplyResult(raw if type(raw) is int else -1, False, error=str(exc))
        if desired == self._desired:
            self._set_generation(generation, unavailable=())
            self.applied_state = content_of(state)
            return ApplyResult(generation, True)
        loaded, failures, spares = await self._converge_versions(desired)
        if failures:
            return await self._apply_in_part(content_of(state), loaded, failures, spares)
        await self._swap(generation, desired, content_of(state), loaded)
        return ApplyResult(generation, True)

    async def _apply_in_part(self, state: dict, loaded: dict, failures: dict[str, dict[int, str]],
                             spares: dict[str, tuple[dict, list]]) -> ApplyResult:
        """Serve ``state`` but for the failing models: each on what it served before, or, with
        nothing served before, on the versions of it that loaded (a fresh worker serves the
        stable while a canary fails), or on nothing (its requests get a 503 naming it). Not
        applied at all when nothing was served and nothing would be."""
        served_state, in_part, in_part_policies = self._keeping(state, failures), [], []
        for name, failed in failures.items():
            reduced = without_versions(state["models"][name], failed)
            if name not in served_state["models"] and any(route["weight"] > 0 for route in reduced["routes"]):
                served_state["models"][name] = reduced
                # Only what loaded now: versions held from another epoch's entry route nothing.
                versions, policies = spares[name]
                loaded = {key: version for key, version in loaded.items() if key[0] != name} | versions
                in_part.append(name)
                in_part_policies.extend(policies)
        self._close_unrouted(spares, loaded)
        reasons = "; ".join(reason for failed in failures.values() for reason in failed.values())
        try:
            generation, desired = parse_state(served_state, self.config)
        except ContractError as error:  # parts of two valid states; refused all the same, nothing swapped
            self._unload_unused(loaded)
            return ApplyResult(state["generation"], False, error=f"{reasons}; the rest could not be applied alone: {error}")
        if self._desired is None and not desired.model_names:
            return ApplyResult(generation, False, error=reasons)
        _set_policies(in_part_policies)
        absent = sorted(name for name in failures if name not in served_state["models"])
        # A failing model with no entry kept (another epoch's) routes nothing: its versions go.
        loaded = {key: version for key, version in loaded.items() if key[0] not in absent}
        before = self.applied_state or {}
        if desired != self._desired or served_state.get("epoch") != before.get("epoch"):
            # Another epoch's state served the same routes: served now as this console's.
            await self._swap(generation, desired, served_state, loaded, absent)
        elif served_state["models"] != before.get("models"):
            # The same routes, but other entries (a drill's roll forward is a new release with
            # the routes before): served as the new generation, so each model is proved by
            # its digest; kept as the old one, the console never counted it converged.
            self._set_generation(generation, tuple(absent))
            self.applied_state = served_state
        elif tuple(absent) != self._unavailable:
            # Only failing models changed: what is served, and its generation, stay as they are
            # (the console still sees the state it issued before, proved by its digest), but a
            # model added with nothing loaded answers its 503, not "unknown model".
            self._unavailable = tuple(absent)
            self.router.swap(self._table(self.generation, self._desired))
        words = [f"{name} ({SERVED_AS['absent' if name in absent else 'in part' if name in in_part else 'before']})" for name in sorted(failures)]
        return ApplyResult(generation, False, error=f"{PARTLY_APPLIED}{', '.join(words)}: {reasons}", kept=tuple(sorted(failures)))

    def _close_unrouted(self, spares: dict[str, tuple[dict, list]], loaded: dict) -> None:
        """Close the versions of failing models that loaded but are not served (their model
        keeps what it served before)."""
        _close_all_but([version for versions, _ in spares.values() for version in versions.values()], [*loaded.values(), *self._loaded.values()])

    async def _swap(self, generation: int, desired: ServingPlan, served_state: dict, loaded: dict, absent=()) -> None:
        """Route ``desired`` from ``loaded`` (one reference assignment), then retire and evict
        what nothing routes or keeps warm any more."""
        retired = [version for key, version in self._loaded.items() if loaded.get(key) is not version]
        self._loaded, self._desired, self.generation, self.applied_state = loaded, desired, generation, served_state
        self._unavailable = tuple(absent)
        self.router.swap(self._table(generation, desired))
        self.is_ready = True
        metrics.LOADED_VERSIONS.set(len(loaded))
        self._retire_after_the_ack(retired)
        served = {version.spec.sha256 for version in loaded.values()}
        await asyncio.to_thread(evict_unused_artifacts, self.config.cache_dir, served)

    def _unload_unused(self, loaded: dict) -> None:
        """Close what a call loaded and is not swapped in (nothing serves it yet)."""
        _close_all_but(loaded.values(), self._loaded.values())

    def _keeping(self, state: dict, failures: dict) -> dict:
        """What this worker serves when the other models' changes apply: ``state`` with each
        failing model's entry as it was applied before."""
        return with_entries_from(state, self.applied_state, failures)

    def serve_nothing_because(self, *failures: str) -> None:
        """Say, in every 503 until a state applies, why there is nothing to serve. Kept to
        what failed; the details (paths, addresses) are in the worker's log, not in answers
        to clients."""
        self.not_ready_reason = f"no state applied: {', and '.join(failures)}; the worker's log says why"

    def _set_generation(self, generation: int, unavailable: tuple[str, ...]) -> None:
        """The same routes under a new generation (or with other models answering 503)."""
        if generation != self.generation or unavailable != self._unavailable:
            self.generation, self._unavailable = generation, unavailable
            self.router.swap(self._table(generation, self._desired))

    async def _converge_versions(self, desired: ServingPlan) -> tuple[dict, dict[str, dict[int, str]], dict[str, tuple[dict, list]]]:
        """Every desired version loaded and warm, model by model: what to route, why each
        version of a failing model failed (by model, then version), and the versions of
        the failing models that did load with their new batching (``_apply_in_part``
        decides whether they serve).
        A failing model's versions in what to route are those loaded before, its batching
        as it was. Anything else that ends the call (an unforeseen error, a cancelled
        apply) unloads what it loaded and changes no batching."""
        loaded, failures, spares, policies = {}, {}, {}, []
        try:
            for model_name in desired.model_names:
                model_loaded, model_policies, failed = await self._converge_model(desired, model_name)
                if failed:
                    failures[model_name], spares[model_name] = failed, (model_loaded, model_policies)
                    loaded.update({key: version for key, version in self._loaded.items() if key[0] == model_name})
                else:
                    loaded.update(model_loaded)
                    policies.extend(model_policies)
        except BaseException:
            self._unload_unused({**loaded, **{key: version for versions, _ in spares.values() for key, version in versions.items()}})
            raise
        # Only once every model is through: an apply that ends early leaves the served batching as it was.
        _set_policies(policies)
        return loaded, failures, spares

    async def _converge_model(self, desired: ServingPlan, model_name: str) -> tuple[dict, list, dict[int, str]]:
        """The model's desired versions that load and warm, the batching each kept one takes,
        and why each of the others failed (every version is tried)."""
        loaded, fresh, policies, failed = {}, [], [], {}
        try:
            for spec in desired.versions:
                if spec.model_name != model_name:
                    continue
                try:
                    current = self._loaded.get(spec.key)
                    if current is not None and current.spec.sha256 == spec.sha256:
                        await self._warm_for(current, spec.policy)
                        policies.append((current, spec.policy))
                        loaded[spec.key] = current
                    else:
                        loaded[spec.key] = await load_version(spec, self.config, self.device, self.fetch)
                        fresh.append(loaded[spec.key])
                except LoadError as error:
                    failed[spec.version] = str(error)
        except BaseException:
            for version in fresh:
                version.close()
            raise
        for key in desired.warm_keys:
            if key[0] != model_name:
                continue
            if key in self._loaded:
                loaded[key] = self._loaded[key]
            else:
                logger.warning("%s v%s: listed warm but not loaded here and no artifact given; skipped", *key)
        return loaded, policies, failed

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
        for model_name in self._unavailable:  # the console routes it, its versions failed here: a 503, not "unknown model"
            models[model_name] = unavailable_routes(f"model '{model_name}' could not be loaded on this worker; its log says why")
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
            # A generation served in part (a model kept apart) read as served whole.
            "last_apply": self.last_apply,
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
