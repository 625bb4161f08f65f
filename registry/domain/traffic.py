"""A model's traffic split: which versions get how much of it (``Route``), the split a
canary share makes, and the checks of a requested split."""

from __future__ import annotations

from dataclasses import dataclass

# The smallest share of requests a shadow mirrors: one in 10,000. A smaller one (5e-324
# was taken) mirrors nothing a window could judge, and read "shadow 0%".
MIN_SHADOW_FRACTION = 0.0001
SHADOW_FRACTION_WORDS = f"a fraction from {MIN_SHADOW_FRACTION:g} (one request in 10,000) to 1"


@dataclass(frozen=True)
class Route:
    version: int
    weight: int
    shadow: float | None = None

    @classmethod
    def from_json(cls, data: dict) -> Route:
        return cls(version=data["version"], weight=data["weight"], shadow=data.get("shadow"))

    def to_json(self) -> dict:
        data = {"version": self.version, "weight": self.weight}
        if self.shadow is not None:
            data["shadow"] = self.shadow
        return data

    @property
    def receives_requests(self) -> bool:
        """Whether its version answers a share of clients or is mirrored a share of them."""
        return self.weight > 0 or bool(self.shadow)

    def describe(self) -> str:
        if self.shadow is not None:
            return f"v{self.version} shadow {percent(self.shadow)}"
        return f"v{self.version} {self.weight}%"


def percent(fraction: float) -> str:
    """A shadow's share as people read it: 50%, 12.5%, 0.01% (":.0%" read 0% below 0.5%)."""
    return f"{fraction * 100:.3g}%"


class InvalidRoutes(ValueError):
    pass


class VersionNotReady(InvalidRoutes):
    """A route names a version that cannot take traffic; the caller, which can look its
    status up, says why (``not_ready_words``)."""

    def __init__(self, version: int):
        super().__init__(f"version {version} does not exist or is not ready")
        self.version = version


NOT_READY_WORDS = {
    "validating": "is still being validated: it can take traffic once it is ready",
    "rejected": "was rejected by its validation (its page says why): it cannot take traffic",
    "archived": "is archived: it cannot take traffic",
}


def not_ready_words(version: int, status: str | None) -> str:
    """Why ``version`` (of ``status``; None: there is none) takes no traffic, in words."""
    if status is None:
        return f"version {version} does not exist"
    return f"version {version} {NOT_READY_WORDS.get(status, 'is not ready')}"


def routes_to_json(routes: list[Route]) -> list[dict]:
    return [route.to_json() for route in routes]


def versions_receiving(routes: list[dict]) -> list[int]:
    """The versions of a release's routes (as stored) that answer or are mirrored requests."""
    return [route.version for route in map(Route.from_json, routes) if route.receives_requests]


def canary_split(stable_version: int | None, canary_version: int, canary_weight: int) -> list[dict]:
    """The routes giving the canary ``canary_weight`` percent and the stable version the
    rest. 0% and 100% are single routes (stable only, or the canary alone), so workers do
    not keep a version loaded for a share of nothing; without a stable version the canary
    takes everything."""
    if canary_weight == 100 or stable_version is None:
        return routes_to_json([Route(version=canary_version, weight=100)])
    if canary_weight == 0:
        return routes_to_json([Route(version=stable_version, weight=100)])
    return routes_to_json([Route(version=stable_version, weight=100 - canary_weight), Route(version=canary_version, weight=canary_weight)])


def check_routes(raw: object, ready_versions: set[int]) -> list[Route]:
    """Parse and check a routes list; raise InvalidRoutes naming the first problem."""
    if not isinstance(raw, list) or not raw:
        raise InvalidRoutes("routes must be a non-empty list of {version, weight} objects")
    routes = [_parse_route(index, item) for index, item in enumerate(raw)]
    _check_unique(routes)
    _check_ready(routes, ready_versions)
    total = sum(route.weight for route in routes)
    if total != 100:
        raise InvalidRoutes(f"weights must sum to 100, got {total}")
    return routes


def _parse_route(index: int, item: object) -> Route:
    if not isinstance(item, dict):
        raise InvalidRoutes(f"routes[{index}] must be an object")
    unknown = set(item) - {"version", "weight", "shadow"}
    if unknown:
        raise InvalidRoutes(f"routes[{index}] has unknown field(s) {sorted(unknown)}")
    version = item.get("version")
    if not _is_int(version) or version < 1:
        raise InvalidRoutes(f"routes[{index}].version must be a positive integer")
    if "shadow" in item:
        return _parse_shadow(index, version, item)
    weight = item.get("weight")
    if not _is_int(weight) or not 0 <= weight <= 100:
        raise InvalidRoutes(f"routes[{index}].weight must be an integer from 0 to 100")
    return Route(version=version, weight=weight)


def _parse_shadow(index: int, version: int, item: dict) -> Route:
    shadow = item["shadow"]
    if isinstance(shadow, bool) or not isinstance(shadow, (int, float)) or not MIN_SHADOW_FRACTION <= shadow <= 1:
        raise InvalidRoutes(f"routes[{index}].shadow must be {SHADOW_FRACTION_WORDS}")
    if item.get("weight", 0) != 0:
        raise InvalidRoutes(f"routes[{index}] is a shadow: its weight must be 0 (it never answers clients)")
    return Route(version=version, weight=0, shadow=float(shadow))


def _check_unique(routes: list[Route]) -> None:
    seen: set[int] = set()
    for route in routes:
        if route.version in seen:
            raise InvalidRoutes(f"version {route.version} appears twice in routes")
        seen.add(route.version)


def _check_ready(routes: list[Route], ready_versions: set[int]) -> None:
    for route in routes:
        if route.version not in ready_versions:
            raise VersionNotReady(route.version)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
