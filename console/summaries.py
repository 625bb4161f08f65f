"""What the pages summarise: live figures from workers' reports, a release's split and
health, a rollout's steps and verdict, shared by page loads and live fragment refreshes."""

from __future__ import annotations

from bisect import bisect_right
from datetime import datetime, timedelta

from django.db.models import Sum
from django.utils import timezone

from registry.domain.canary_analysis import DEFAULTS, FAIL
from registry.domain.choices import RolloutStatus
from registry.domain.traffic import Route, percent
from registry.fleet.state import warm_versions
from registry.fleet.workers import GONE_LISTED_FOR, failed_to_apply, gone_workers
from registry.models import Release, Rollout, RolloutVerdict, VersionMetricMinute

# Health judges the per-minute roll-ups from the minute that held this moment ago: one
# report's second of traffic is too little to call a model idle or failing.
RECENT_WINDOW = timedelta(seconds=60)
_TOLERANCE = 1e-9  # as the canary analysis: a rate exactly at its limit passes
_COUNTED = ("requests_per_s", "requests", "errors", "client_errors", "queue_depth")


def describe_routes(routes: list[dict]) -> str:
    return ", ".join(Route.from_json(route).describe() for route in routes)


# ---------------------------------------------------------------- live figures


def live_figures(workers) -> dict[tuple[str, int], dict]:
    """The latest report of each live worker, summed per (model, version): the same
    figures the live feed shows, so a page load and the next second agree. Workers'
    quantiles cannot be merged exactly; the worst worker's is shown, which errs
    towards showing a problem. ``errors`` are 5xx answers, ``client_errors`` 4xx."""
    figures: dict[tuple[str, int], dict] = {}
    for worker in workers:
        for entry in (worker.last_report or {}).get("versions") or []:
            total = figures.setdefault((entry.get("model"), entry.get("version")), _empty_figures())
            for field in _COUNTED:
                total[field] += entry.get(field) or 0
            for field in ("p50_ms", "p99_ms"):
                total[field] = _worst(total[field], entry.get(field))
    for total in figures.values():
        _add_rates(total)
    return figures


def _empty_figures() -> dict:
    return {"requests_per_s": 0.0, "requests": 0, "errors": 0, "client_errors": 0, "queue_depth": 0, "p50_ms": None, "p99_ms": None}


def _add_rates(total: dict) -> None:
    requests = total["requests"]
    total["error_rate"] = total["errors"] / requests if requests else None
    total["client_error_rate"] = total["client_errors"] / requests if requests else None


def _worst(current, new):
    return new if current is None else current if new is None else max(current, new)


def model_figures(figures: dict, model_name: str) -> dict:
    """One model's figures over all its versions."""
    mine = [entry for (model, _), entry in figures.items() if model == model_name]
    total = _empty_figures()
    for entry in mine:
        for field in _COUNTED:
            total[field] += entry[field]
        total["p99_ms"] = _worst(total["p99_ms"], entry["p99_ms"])
    _add_rates(total)
    total["reporting"] = bool(mine)
    return total


def recent_traffic(model_name: str | None = None, now: datetime | None = None) -> dict[tuple[str, int], dict]:
    """Requests, 5xx and 4xx per (model, version) from the roll-ups of the minute that
    held ``RECENT_WINDOW`` ago onwards (60 to 120 s of traffic); one model's or all."""
    since = ((now or timezone.now()) - RECENT_WINDOW).replace(second=0, microsecond=0)
    rows = VersionMetricMinute.objects.filter(minute__gte=since)
    if model_name is not None:
        rows = rows.filter(version__model__name=model_name)
    rows = (rows.values("version__model__name", "version__number")
            .annotate(requests=Sum("requests"), errors=Sum("errors"), client_errors=Sum("client_errors")))
    return {(row["version__model__name"], row["version__number"]): {key: row[key] for key in ("requests", "errors", "client_errors")} for row in rows}


def served_since(rows) -> dict[int, dict]:
    """Per version number: requests and the shares of 5xx and 4xx answers, from roll-up
    sums ``{version__number, requests, errors, client_errors}``."""
    served = {}
    for row in rows:
        requests = row["requests"] or 0
        served[row["version__number"]] = {
            "requests": requests,
            "error_rate": (row["errors"] or 0) / requests if requests else None,
            "client_error_rate": (row["client_errors"] or 0) / requests if requests else None,
        }
    return served


# ---------------------------------------------------------------- release summaries


def split_segments(release: Release | None) -> list[dict]:
    """The split as bar segments, stable first: ``[{version, weight, role, shadow, shadow_percent?}]``."""
    if release is None:
        return []
    ordered = sorted(release.routes, key=lambda route: (route["version"] != release.stable_version, route["version"]))
    return [{**route, "role": _role_in(release, route), **({"shadow_percent": percent(route["shadow"])} if route.get("shadow") else {})}
            for route in ordered]


def _role_in(release: Release, route: dict) -> str:
    if route["version"] == release.stable_version:
        return "stable"
    return "shadow" if route.get("shadow") else "canary"


def canary_route(release: Release | None) -> dict | None:
    """The one weighted non-stable route, when there is exactly one."""
    canaries = weighted_canaries(release)
    return canaries[0] if len(canaries) == 1 else None


def weighted_canaries(release: Release | None) -> list[dict]:
    """Every route that sends traffic to a version other than the stable one."""
    if release is None:
        return []
    return [route for route in release.routes if route["weight"] > 0 and route["version"] != release.stable_version]


def version_roles(release: Release | None) -> dict[int, str]:
    """stable / canary / shadow for routed versions, warm for the rollback target's."""
    if release is None:
        return {}
    roles = {number: "warm" for number in warm_versions(release)}
    roles.update({segment["version"]: segment["role"] for segment in split_segments(release)})
    return roles


def releases_in_force(moments: list[datetime], timeline: list[tuple[datetime, int]]) -> list[int | None]:
    """For each moment, the generation of the newest release made at or before it;
    ``timeline`` is (created_at, generation) in order. None before the first release."""
    times = [made for made, _ in timeline]
    found = []
    for moment in moments:
        index = bisect_right(times, moment)
        found.append(timeline[index - 1][1] if index else None)
    return found


# ---------------------------------------------------------------- health


def health(release: Release | None, convergence: dict, recent: dict[int, dict], verdict: RolloutVerdict | None = None) -> tuple[str, str]:
    """(level, words) answering "is anything wrong with this model?" at a glance.

    ``recent`` is the model's traffic per version number over the recent window
    (``recent_traffic``); ``verdict`` the last verdict of its running rollout, if any.
    "Healthy" needs traffic, a verdict with no failing signal when there is one, and
    every version's 5xx and 4xx rates within the canary analysis' default thresholds."""
    if release is None:
        return "idle", "No version routed yet"
    if release.is_archive:
        return "idle", "Archived: serves nothing"
    problem = _fleet_problem(release, convergence)
    if problem:
        return problem
    if verdict is not None and verdict.result == FAIL:
        return "bad", "; ".join(verdict_problems(verdict))
    if not any(figures["requests"] for figures in recent.values()):
        return "idle", f"Idle: no requests in the last {RECENT_WINDOW.seconds // 60} min"
    problems = rate_problems(release, recent)
    if problems:
        return "bad", "; ".join(problems)
    return "ok", "Healthy"


def _fleet_problem(release: Release, convergence: dict) -> tuple[str, str] | None:
    rows = convergence["workers"]
    if not rows:
        return "warn", "No live workers"
    # A worker serving this model as issued, while another model fails there, is that
    # model's problem (its page says so): every model read "bad" for one broken canary.
    failed = [row for row in rows if not row["ok"] and not row["converged"]]
    if failed:
        return "bad", f"{len(failed)} of {len(rows)} workers {failed_to_apply(failed[0]['error'])}"
    behind = [row for row in rows if not row["converged"]]
    if behind:
        first = behind[0]
        return "warn", f"{len(behind)} of {len(rows)} workers converging to generation {release.generation} ({first['worker_id']}: {first['state']})"
    silent = convergence.get("unconfirmed_silent") or []
    if silent:
        first = silent[0]
        return "warn", (f"{len(silent)} silent worker{'s' if len(silent) > 1 else ''} not confirmed on generation {release.generation} "
                        f"({first['worker_id']}: {first['state']})")
    # Last: a convergence in progress passes, a gone worker stays named for the hour.
    return _gone_problem()


def _gone_problem() -> tuple[str, str] | None:
    """Workers gone (silent past WORKER_GONE_AFTER_S without saying they stopped) for as
    long as the Workers page lists them: convergence counts live workers only, so a frozen
    or crashed one left the badge "Healthy" beside "2/2 converged" while the fleet served
    with a worker fewer."""
    now = timezone.now()
    recently = gone_workers().filter(last_seen_at__gte=now - GONE_LISTED_FOR)
    seen = list(recently.order_by("-last_seen_at").values_list("last_seen_at", flat=True))
    if not seen:
        return None
    shortest, longest = (_silence_words((now - moment).total_seconds()) for moment in (seen[0], seen[-1]))
    if len(seen) == 1:
        return "warn", f"1 worker gone (silent {shortest})"
    return "warn", f"{len(seen)} workers gone (silent {shortest} to {longest})"


def _silence_words(seconds: float) -> str:
    """7.9 -> '7 s', 200 -> '3 min': whole units, never more than it has been."""
    return f"{int(seconds)} s" if seconds < 120 else f"{int(seconds // 60)} min"


def rate_problems(release: Release, recent: dict[int, dict]) -> list[str]:
    """Versions whose 5xx or 4xx share is over the default limit: the stable's own share,
    another version's share in excess of the stable's (the limits are excesses)."""
    roles = {segment["version"]: segment["role"] for segment in split_segments(release)}
    stable = _rates(recent.get(release.stable_version))
    problems = []
    for number in sorted(recent, key=lambda number: (number != release.stable_version, number)):
        rates = _rates(recent[number])
        if rates is None:
            continue
        baseline = (0.0, 0.0) if number == release.stable_version or stable is None else stable
        label = f"v{number} ({roles.get(number, 'not routed')})"
        for name, rate, base, limit in (("Server errors", rates[0], baseline[0], DEFAULTS.max_server_error_excess),
                                        ("Client errors", rates[1], baseline[1], DEFAULTS.max_client_error_excess)):
            if rate - base > limit + _TOLERANCE:
                problems.append(f"{name} {share(rate)} on {label}")
    return problems


def _rates(figures: dict | None) -> tuple[float, float] | None:
    if not figures or not figures["requests"]:
        return None
    return figures["errors"] / figures["requests"], figures["client_errors"] / figures["requests"]


def share(fraction: float) -> str:
    """0.5 -> '50%', 0.0123 -> '1.2%', 0.0004 -> '0.04%'."""
    value = round(fraction * 100, 9)  # 0.07 * 100 is 7.000000000000001
    if value == round(value):
        return f"{value:.0f}%"
    return f"{value:.1f}%" if value >= 1 else f"{value:.2g}%"


# ---------------------------------------------------------------- rollouts


SIGNAL_LABELS = {"server_errors": "Server errors (5xx)", "client_errors": "Client errors (4xx)", "latency_p99": "p99 latency",
                 "shadow_agreement": "Shadow agreement"}


def verdict_problems(verdict: RolloutVerdict) -> list[str]:
    """The failing signals of a verdict, each in a few words with the canary's number."""
    rollout = verdict.rollout
    words = []
    for signal in verdict.signals:
        if signal.get("passed") is not False:
            continue
        name = signal["name"]
        if name in ("server_errors", "client_errors"):
            kind = "Server errors" if name == "server_errors" else "Client errors"
            words.append(f"{kind} {share(signal['value'])} on canary v{rollout.canary_version} (stable {share(signal['stable_value'])})")
        elif name == "latency_p99":
            words.append(f"p99 {signal['value']:.1f} ms on canary v{rollout.canary_version} (limit {signal['threshold']:.1f} ms)")
        else:
            words.append(signal.get("detail") or name)
    return words or [verdict.reason]


def signal_rows(verdict: RolloutVerdict | None) -> list[dict]:
    """The verdict's signals as table rows: label, canary, stable, threshold, state, detail."""
    if verdict is None:
        return []
    return [_signal_row(signal) for signal in verdict.signals]


def _signal_row(signal: dict) -> dict:
    name = signal["name"]
    show = _formatter(name)
    state = {True: "pass", False: "fail"}.get(signal.get("passed"), "unjudged")
    label = SIGNAL_LABELS.get(name) or (f"Output {name.split(':', 1)[1]}" if name.startswith("output:") else name)
    return {"name": name, "label": label, "canary": show(signal.get("value")), "stable": show(signal.get("stable_value")),
            "threshold": _threshold(name, signal.get("threshold"), show), "state": state, "detail": signal.get("detail", "")}


def _formatter(name: str):
    if name in ("server_errors", "client_errors", "shadow_agreement"):
        return lambda value: "—" if value is None else share(value)
    if name == "latency_p99":
        return lambda value: "—" if value is None else f"{value:.1f} ms" if value >= 10 else f"{value:.2f} ms"
    return lambda value: "—" if value is None else f"{value:.3f}"


def _threshold(name: str, value, show) -> str:
    if value is None:
        return "—"
    if name in ("server_errors", "client_errors"):
        return f"+{share(value)} over stable"
    if name == "shadow_agreement":
        return f"at least {share(value)}"
    return f"at most {show(value)}"


def rollout_steps(rollout: Rollout) -> list[dict]:
    """Each step of the plan, done, current or still to come (a finished rollout's
    steps are all done when it was promoted)."""
    current = min(rollout.step_index, len(rollout.steps) - 1)
    promoted = rollout.status == RolloutStatus.PROMOTED
    return [{"number": index + 1, "weight": weight,
             "state": "done" if promoted or index < current else "current" if index == current else "todo"}
            for index, weight in enumerate(rollout.steps)]


def rollout_state_key(rollout: Rollout) -> str:
    """What the panel shows of a rollout, as its script compares it with the API's answer."""
    step = min(rollout.step_index, len(rollout.steps) - 1) + 1
    return f"{rollout.status}:{rollout.windows_judged}:{step}:{rollout.consecutive_failures}:{rollout.release_generation}"


def report_totals(report: dict | None) -> dict:
    """A worker's last report over all its versions: requests/s, 5xx and 4xx shares."""
    total = _empty_figures()
    for entry in (report or {}).get("versions") or []:
        for field in _COUNTED:
            total[field] += entry.get(field) or 0
    _add_rates(total)
    return {"requests_per_s": total["requests_per_s"], "error_rate": total["error_rate"], "client_error_rate": total["client_error_rate"]}


def duration_words(seconds: float) -> str:
    """300 -> '5 min', 90 -> '90 s', 7200 -> '2 h'."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
