"""What the pages summarise: live figures from workers' reports, and a release's split
and health, shared by page loads and live fragment refreshes."""

from __future__ import annotations

from registry.domain.traffic import Route
from registry.fleet.state import warm_versions
from registry.models import Release

ERROR_RATE_WARNING = 0.01  # above this share of 5xx answers a model's row turns red


def describe_routes(routes: list[dict]) -> str:
    return ", ".join(Route.from_json(route).describe() for route in routes)


# ---------------------------------------------------------------- live figures


def live_figures(workers) -> dict[tuple[str, int], dict]:
    """The latest report of each live worker, summed per (model, version): the same
    figures the live feed shows, so a page load and the next second agree. Workers'
    quantiles cannot be merged exactly; the worst worker's is shown, which errs
    towards showing a problem."""
    figures: dict[tuple[str, int], dict] = {}
    for worker in workers:
        for entry in (worker.last_report or {}).get("versions") or []:
            total = figures.setdefault((entry.get("model"), entry.get("version")), _empty_figures())
            for field in ("requests_per_s", "requests", "errors", "queue_depth"):
                total[field] += entry.get(field) or 0
            for field in ("p50_ms", "p99_ms"):
                total[field] = _worst(total[field], entry.get(field))
    for total in figures.values():
        total["error_rate"] = total["errors"] / total["requests"] if total["requests"] else None
    return figures


def _empty_figures() -> dict:
    return {"requests_per_s": 0.0, "requests": 0, "errors": 0, "queue_depth": 0, "p50_ms": None, "p99_ms": None}


def _worst(current, new):
    return new if current is None else current if new is None else max(current, new)


def model_figures(figures: dict, model_name: str) -> dict:
    """One model's figures over all its versions."""
    mine = [entry for (model, _), entry in figures.items() if model == model_name]
    total = _empty_figures()
    for entry in mine:
        for field in ("requests_per_s", "requests", "errors", "queue_depth"):
            total[field] += entry[field]
        total["p99_ms"] = _worst(total["p99_ms"], entry["p99_ms"])
    total["error_rate"] = total["errors"] / total["requests"] if total["requests"] else None
    total["reporting"] = bool(mine)
    return total


# ---------------------------------------------------------------- release summaries


def split_segments(release: Release | None) -> list[dict]:
    """The split as bar segments, stable first: ``[{version, weight, role, shadow}]``."""
    if release is None:
        return []
    ordered = sorted(release.routes, key=lambda route: (route["version"] != release.stable_version, route["version"]))
    return [{**route, "role": _role_in(release, route)} for route in ordered]


def _role_in(release: Release, route: dict) -> str:
    if route["version"] == release.stable_version:
        return "stable"
    return "shadow" if route.get("shadow") else "canary"


def canary_route(release: Release | None) -> dict | None:
    """The one weighted non-stable route, when there is exactly one."""
    if release is None:
        return None
    canaries = [route for route in release.routes if route["weight"] > 0 and route["version"] != release.stable_version]
    return canaries[0] if len(canaries) == 1 else None


def version_roles(release: Release | None) -> dict[int, str]:
    """stable / canary / shadow for routed versions, warm for the rollback target's."""
    if release is None:
        return {}
    roles = {number: "warm" for number in warm_versions(release)}
    roles.update({segment["version"]: segment["role"] for segment in split_segments(release)})
    return roles


def health(release: Release | None, convergence: dict, figures: dict) -> tuple[str, str]:
    """(level, words) answering "is anything wrong with this model?" at a glance."""
    if release is None:
        return "idle", "No version routed yet"
    rows = convergence["workers"]
    if not rows:
        return "warn", "No live workers"
    failed = [row for row in rows if not row["ok"]]
    if failed:
        return "bad", f"{len(failed)} of {len(rows)} workers failed to apply: {failed[0]['error'] or 'unknown error'}"
    behind = [row for row in rows if not row["converged"]]
    if behind:
        first = behind[0]
        return "warn", f"{len(behind)} of {len(rows)} workers converging to generation {release.generation} ({first['worker_id']}: {first['state']})"
    if figures["error_rate"] is not None and figures["error_rate"] > ERROR_RATE_WARNING:
        return "bad", f"Errors {figures['error_rate']:.1%} of requests"
    return "ok", "Healthy"
