"""What a worker serves, derived from a desired state: the versions to load (with their
artifacts' locations resolved on the console's origin), their weights and shadows.

The contract (serving/contract.py) checks the state's shape; this module adds the one
check that needs the worker's own settings (artifact URLs), so a state is judged whole
before anything is fetched.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from serving import contract
from serving.config import ServingConfig
from serving.console_client import ArtifactRefused, artifact_location
from serving.contract import BatchPolicy, ContractError


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
class ServingPlan:
    """What this worker serves, derived from a parsed ``contract.DesiredState``. Compared
    with the one applied: a new generation of the same content only bumps the generation."""

    versions: tuple[VersionSpec, ...]  # routed and warm ones, each once
    warm_keys: tuple[tuple[str, int], ...]  # warm by number only: kept if loaded, never fetched
    weights: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]  # model -> ((version, weight), ...)
    shadows: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()  # model -> ((version, fraction), ...)

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.weights)


def parse_state(state: object, config: ServingConfig) -> tuple[int, ServingPlan]:
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
    return desired.generation, ServingPlan(tuple(specs), tuple(warm_keys), tuple(weights), tuple(shadows))


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
