"""The traffic split: which loaded version serves a request, by weight or by sticky
routing key, read from an immutable table swapped by reference.

The request path reads `router.table` once and never locks: a swap assigns a new
`RoutingTable`, and a request that already read the old one finishes on it (the
repository drains a retired version before unloading it).
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field
from hashlib import blake2b
from types import MappingProxyType
from typing import Generic, Mapping, TypeVar

from serving.errors import ModelNotFound, NotFound, NotReady, VersionNotFound

BUCKETS = 10_000  # weights are percentages; 10k buckets give 0.01% resolution

V = TypeVar("V")  # whatever the repository routes to (a loaded version)


class VersionNotRouted(NotFound):
    """A pinned version that is loaded but takes no traffic (warm or shadow only)."""

    def __init__(self, model_name: str, version: int):
        super().__init__(
            f"model '{model_name}' version {version} takes no traffic (it is only warm or a shadow); "
            "pinned requests may name only a routed version"
        )


@dataclass(frozen=True, slots=True)
class ModelRoutes(Generic[V]):
    """The split of one model: routed versions with their cumulative bucket bounds."""

    versions: tuple[int, ...]
    weights: tuple[int, ...]
    bounds: tuple[int, ...]  # bounds[i] = first bucket *after* versions[i]
    targets: Mapping[int, V]  # routed and warm versions, by number (pinned requests)
    shadows: tuple[tuple[int, float], ...] = ()  # (version, fraction of requests mirrored)
    unavailable: str = ""  # why nothing of a model the console routes is loaded here

    def choose(self, routing_key: str | None) -> int:
        if not self.versions:
            raise NotReady(self.unavailable or "no version of this model is routed")
        bucket = bucket_of(routing_key) if routing_key else random.randrange(BUCKETS)
        return self.versions[bisect.bisect_right(self.bounds, bucket)]


def bucket_of(routing_key: str) -> int:
    """A stable bucket in 0..BUCKETS-1: the same key lands in the same bucket everywhere."""
    digest = blake2b(routing_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def unavailable_routes(why: str) -> ModelRoutes:
    """A model the console routes that has nothing loaded here: every request is a 503 saying ``why``."""
    return ModelRoutes((), (), (), MappingProxyType({}), (), why)


def build_routes(weights_by_version: Mapping[int, int], targets: Mapping[int, V], shadows=()) -> ModelRoutes[V]:
    """Routes from {version: weight%}; weight-0 versions stay pinnable but get no traffic."""
    routed = [(version, weight) for version, weight in sorted(weights_by_version.items()) if weight > 0]
    total = sum(weight for _, weight in routed)
    bounds, running = [], 0
    for _, weight in routed:
        running += weight
        bounds.append(running * BUCKETS // total)
    return ModelRoutes(
        versions=tuple(version for version, _ in routed),
        weights=tuple(weight for _, weight in routed),
        bounds=tuple(bounds),
        targets=MappingProxyType(dict(targets)),
        shadows=tuple((version, fraction) for version, fraction in shadows if version in targets),
    )


@dataclass(frozen=True, slots=True)
class RoutingTable(Generic[V]):
    generation: int = 0
    models: Mapping[str, ModelRoutes[V]] = field(default_factory=lambda: MappingProxyType({}))
    # Warm versions (rollback targets) and shadows are loaded for the operators' sake, not
    # offered to clients: a rolled-back or still-judged version stays out of reach unless
    # the worker's SERVING_ALLOW_PINNING_UNROUTED says otherwise.
    allow_pinning_unrouted: bool = False

    def model(self, model_name: str) -> ModelRoutes[V]:
        routes = self.models.get(model_name)
        if routes is None:
            raise ModelNotFound(model_name)
        return routes

    def resolve(self, model_name: str, version: int | None, routing_key: str | None = None) -> V:
        """The target for a request: pinned `version` if given, else by weights/key."""
        routes = self.model(model_name)
        if version is None:
            version = routes.choose(routing_key)
        target = routes.targets.get(version)
        if target is None:  # an unavailable model has no target: said here, off the path of a served request
            raise NotReady(routes.unavailable) if routes.unavailable else VersionNotFound(model_name, version)
        if version not in routes.versions and not self.allow_pinning_unrouted:
            raise VersionNotRouted(model_name, version)
        return target


class Router(Generic[V]):
    """Holds the current table; `swap` is one reference assignment."""

    def __init__(self) -> None:
        self.table: RoutingTable[V] = RoutingTable()

    def swap(self, table: RoutingTable[V]) -> None:
        self.table = table
