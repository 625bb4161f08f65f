"""The judge of a canary: one window of a version's figures against the stable version's,
turned into a verdict — pass, fail, or waiting for data — with every signal it weighed
and one sentence saying why.

Pure (no ORM): the rollout state machine collects each side's worker reports for a window
(``aggregate``), asks ``judge`` for a verdict, and rolls back once ``failing_streak``
reaches the rollout's ``failure_limit``. The thresholds come from ``AnalysisSettings``,
which a user may override per rollout (``AnalysisSettings.parse``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from registry.domain.distribution_tests import (
    chi_square_homogeneity,
    excess_proportion_p,
    histogram_quantile,
    js_distance,
    ks_two_sample,
    psi,
)

PASS = "pass"
FAIL = "fail"
WAITING_FOR_DATA = "waiting_for_data"

# Samples of a values output kept per side per window: enough for a KS test to resolve a
# D of about 0.04 at the 1 % level, few enough that a window's verdict stays cheap.
MAX_SAMPLE = 4096
# Comparisons at a threshold pass; this keeps 0.07 - 0.06 (= 0.010000000000000009) and its
# kin from deciding a boundary case by a rounding error.
_TOLERANCE = 1e-9
_SHOWN_CLASSES = 4


class InvalidAnalysis(ValueError):
    """An analysis setting a user asked for that cannot be used; the message names it."""


@dataclass(frozen=True)
class _Rule:
    is_integer: bool
    minimum: float
    maximum: float

    def describe(self) -> str:
        kind = "an integer" if self.is_integer else "a number"
        return f"{kind} from {self.minimum:g} to {self.maximum:g}"


MIN_ALPHA = 0.001

_RULES = {
    "interval_s": _Rule(True, 1, 3600),
    "min_requests": _Rule(True, 1, 10_000_000),
    "failure_limit": _Rule(True, 1, 100),
    "max_server_error_excess": _Rule(False, 0, 1),
    "max_client_error_excess": _Rule(False, 0, 1),
    "max_latency_p99_ratio": _Rule(False, 1, 1000),
    "latency_p99_floor_ms": _Rule(False, 0, 60_000),
    "max_latency_p99_ms": _Rule(False, 1, 600_000),
    "max_class_psi": _Rule(False, 0, 10),
    "max_value_ks": _Rule(False, 0, 1),
    # At 0 no p-value is below it, so no statistical gate could ever fail: a canary
    # answering only 5xx was promoted (7 Dec attack). 0.001 is the strictest a user may ask.
    "alpha": _Rule(False, MIN_ALPHA, 1),
    "min_shadow_agreement": _Rule(False, 0, 1),
    "min_shadow_compared": _Rule(True, 1, 10_000_000),
}


def json_schema() -> dict:
    """The JSON Schema of an ``analysis`` object (for the OpenAPI document): every field
    optional, each with its type and range, nothing else allowed."""
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {name: {"type": "integer" if rule.is_integer else "number", "minimum": rule.minimum, "maximum": rule.maximum}
                       for name, rule in _RULES.items()},
    }


def _checked(name: str, value: object, rule: _Rule) -> int | float:
    # bool is an int to Python, never a number to a user; NaN fails the range test.
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not is_number or (rule.is_integer and not isinstance(value, int)) or not rule.minimum <= value <= rule.maximum:
        raise InvalidAnalysis(f"analysis.{name} must be {rule.describe()}, got {_shown(value)}")
    return int(value) if rule.is_integer else float(value)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class AnalysisSettings:
    """How a canary is judged. Every check compares the canary with the stable version
    over the same window, so load that slows both does not fail the canary.

    | setting | default | allowed | meaning |
    |---|---|---|---|
    | `interval_s` | 60 | integer 1–3600 | length of one analysis window, and how often one is judged |
    | `min_requests` | 100 | integer 1–10⁷ | requests each side needs in a window before any verdict (fewer: waiting for data); also the outputs each side needs before an output is compared |
    | `failure_limit` | 2 | integer 1–100 | consecutive failing windows that roll the canary back (windows waiting for data neither count nor reset) |
    | `max_server_error_excess` | 0.01 | 0–1 | canary 5xx rate minus stable's 5xx rate |
    | `max_client_error_excess` | 0.02 | 0–1 | canary 4xx rate minus stable's 4xx rate |
    | `max_latency_p99_ratio` | 2.0 | 1–1000 | canary p99 latency at most this times stable's |
    | `latency_p99_floor_ms` | 5.0 | 0–60000 | a stable p99 below this compares as this, so sub-millisecond noise does not fail a step |
    | `max_latency_p99_ms` | 1000.0 | 1–600000 | canary p99 latency ceiling, whatever stable does |
    | `max_class_psi` | 0.2 | 0–10 | population stability index of the canary's predicted-class shares against stable's (0.1 is a moderate shift, 0.25 a significant one); fails only when also significant |
    | `max_value_ks` | 0.2 | 0–1 | Kolmogorov–Smirnov D between the canary's and stable's output values; fails only when also significant |
    | `alpha` | 0.01 | 0.001–1 | significance level of every statistical gate: a PSI over its limit fails only when a chi-square test of the class counts is significant at this level, a KS D only when its p-value is below it, an error excess only when a one-sided two-proportion test is |
    | `min_shadow_agreement` | 0.95 | 0–1 | share of shadowed requests where the canary agreed with stable's answer |
    | `min_shadow_compared` | 50 | integer 1–10⁷ | shadow comparisons needed in a window before agreement is judged |

    A value exactly at its limit passes. Constructing settings checks them (InvalidAnalysis).
    """

    interval_s: int = 60
    min_requests: int = 100
    failure_limit: int = 2
    max_server_error_excess: float = 0.01
    max_client_error_excess: float = 0.02
    max_latency_p99_ratio: float = 2.0
    latency_p99_floor_ms: float = 5.0
    max_latency_p99_ms: float = 1000.0
    max_class_psi: float = 0.2
    max_value_ks: float = 0.2
    alpha: float = 0.01
    min_shadow_agreement: float = 0.95
    min_shadow_compared: int = 50

    def __post_init__(self) -> None:
        for name, rule in _RULES.items():
            object.__setattr__(self, name, _checked(name, getattr(self, name), rule))

    @classmethod
    def parse(cls, raw: object, base: AnalysisSettings | None = None) -> AnalysisSettings:
        """``base`` (the defaults when None) with the fields of a user's JSON object
        ``raw`` overriding it; None overrides nothing. Raises InvalidAnalysis naming the
        first field that is unknown, of the wrong type or out of range."""
        base = base if base is not None else cls()
        if raw is None:
            return base
        if not isinstance(raw, dict):
            raise InvalidAnalysis('analysis must be a JSON object of settings, e.g. {"min_requests": 200}')
        unknown = [name for name in raw if name not in _RULES]
        if unknown:
            raise InvalidAnalysis(f"analysis has unknown field {_shown(unknown[0])}; known fields: {', '.join(_RULES)}")
        return dataclasses.replace(base, **raw)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


DEFAULTS = AnalysisSettings()


# --- One side's figures over a window ---------------------------------------------------


@dataclass
class ClassCounts:
    """A classes output: rows per predicted class index, and rows of a class past the
    reported ones (``other``)."""

    counts: list[int] = field(default_factory=list)
    other: int = 0
    kind: ClassVar[str] = "classes"

    @property
    def total(self) -> int:
        return sum(self.counts) + self.other


@dataclass
class ValueFigures:
    """A values output: how many finite values, their sum, how many were not finite
    (NaN, ±inf: counted apart, as the worker reports them), and a sample of the finite ones."""

    count: int = 0
    sum: float = 0.0
    non_finite: int = 0
    sample: list[float] = field(default_factory=list)
    kind: ClassVar[str] = "values"

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


@dataclass
class ShadowFigures:
    compared: int = 0
    agreed: int = 0
    errors: int = 0
    dropped: int = 0


@dataclass
class SideFigures:
    """One version's figures summed over a window (``aggregate``)."""

    requests: int = 0
    server_errors: int = 0
    client_errors: int = 0
    latency_sum_s: float = 0.0
    latency_buckets: dict[str, int] = field(default_factory=dict)
    outputs: dict[str, ClassCounts | ValueFigures] = field(default_factory=dict)
    shadow: ShadowFigures | None = None

    def summary(self) -> dict:
        """The window's totals as a verdict keeps them (for tables and charts)."""
        p99_ms = _p99_ms(self.latency_buckets)
        return {"requests": self.requests, "server_errors": self.server_errors, "client_errors": self.client_errors,
                "server_error_rate": _rate(self.server_errors, self.requests), "client_error_rate": _rate(self.client_errors, self.requests),
                "p99_ms": None if p99_ms is None else round(p99_ms, 3),
                "shadow": None if self.shadow is None else {"compared": self.shadow.compared, "agreed": self.shadow.agreed,
                                                             "errors": self.shadow.errors, "dropped": self.shadow.dropped}}

    def as_shadow(self) -> SideFigures:
        """A shadow version's window read as a canary's: it answers no client, so its
        "requests" are the mirrored runs (compared, or failed: those are its server errors)
        and it has no latency; its outputs and agreement are its own."""
        shadow = self.shadow or ShadowFigures()
        return SideFigures(requests=shadow.compared + shadow.errors, server_errors=shadow.errors, outputs=self.outputs, shadow=self.shadow)


_OUTPUT_KINDS = {"classes": ClassCounts, "values": ValueFigures}


def aggregate(entries: list[dict]) -> SideFigures:
    """Sum one version's reported figures (one dict per report) over a window. Outputs
    merge by name; an output whose kind differs from the first seen under its name, or of
    an unknown kind, is skipped. Value samples are concatenated, then thinned evenly to at
    most MAX_SAMPLE, so the same reports always give the same sample."""
    side = SideFigures()
    for entry in entries:
        side.requests += _int(entry, "requests")
        side.server_errors += _int(entry, "errors")
        side.client_errors += _int(entry, "client_errors")
        side.latency_sum_s += float(entry.get("latency_sum_s") or 0.0)
        for bound, count in (entry.get("latency_buckets") or {}).items():
            side.latency_buckets[bound] = side.latency_buckets.get(bound, 0) + int(count)
        for output in entry.get("outputs") or []:
            _merge_output(side.outputs, output)
        if isinstance(entry.get("shadow"), dict):
            side.shadow = _merged_shadow(side.shadow, entry["shadow"])
    for output in side.outputs.values():
        if isinstance(output, ValueFigures):
            output.sample = _thinned(output.sample, MAX_SAMPLE)
    return side


def _int(data: dict, key: str) -> int:
    return int(data.get(key) or 0)


def _merge_output(outputs: dict, output: dict) -> None:
    name, kind = output.get("name"), output.get("kind")
    if kind not in _OUTPUT_KINDS or not isinstance(name, str):
        return
    merged = outputs.setdefault(name, _OUTPUT_KINDS[kind]())
    if merged.kind != kind:
        return
    if isinstance(merged, ClassCounts):
        _add_classes(merged, output)
    else:
        _add_values(merged, output)


def _add_classes(merged: ClassCounts, output: dict) -> None:
    counts = list(output.get("counts") or [])
    merged.counts += [0] * (len(counts) - len(merged.counts))
    for index, count in enumerate(counts):
        merged.counts[index] += int(count)
    merged.other += _int(output, "other")


def _add_values(merged: ValueFigures, output: dict) -> None:
    merged.count += _int(output, "count")
    merged.sum += float(output.get("sum") or 0.0)
    merged.non_finite += _int(output, "non_finite")
    merged.sample += [float(value) for value in output.get("sample") or [] if _is_finite(value)]


def _merged_shadow(merged: ShadowFigures | None, shadow: dict) -> ShadowFigures:
    merged = merged or ShadowFigures()
    return ShadowFigures(**{name: getattr(merged, name) + _int(shadow, name) for name in ("compared", "agreed", "errors", "dropped")})


def _is_finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _thinned(sample: list[float], limit: int) -> list[float]:
    if len(sample) <= limit:
        return sample
    return [sample[index * len(sample) // limit] for index in range(limit)]


# --- The verdict ------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """``result`` is PASS, FAIL or WAITING_FOR_DATA; ``signals`` the checks weighed, each
    ``{name, passed (True, False, or None when not judged), value, stable_value,
    threshold, detail}``; ``reason`` one sentence: the failing signals with their numbers,
    the side that lacked requests, or what passed."""

    result: str
    signals: list[dict]
    reason: str

    def to_json(self) -> dict:
        return {"result": self.result, "reason": self.reason, "signals": [dict(signal) for signal in self.signals]}


def judge(canary: SideFigures, stable: SideFigures, settings: AnalysisSettings = DEFAULTS) -> Verdict:
    """The verdict on one window. Fewer than ``min_requests`` on either side waits for
    data (the signals are still worked out for display, all unjudged); otherwise any
    failing signal fails the window, and the reason lists every one that failed, their
    details joined by "; " (which no detail contains)."""
    signals = [
        _error_excess("server_errors", "server errors", canary.server_errors, stable.server_errors, canary, stable,
                      settings.max_server_error_excess, settings.alpha),
        _error_excess("client_errors", "client errors", canary.client_errors, stable.client_errors, canary, stable,
                      settings.max_client_error_excess, settings.alpha),
        _latency_p99(canary, stable, settings),
        *_output_signals(canary, stable, settings),
        *_shadow_signals(canary, settings),
    ]
    quiet = [_quiet_side(label, side, settings.min_requests) for label, side in (("canary", canary), ("stable", stable))
             if side.requests < settings.min_requests]
    if quiet:
        return Verdict(WAITING_FOR_DATA, [_unjudged(signal) for signal in signals], "; ".join(quiet))
    failing = [signal for signal in signals if signal["passed"] is False]
    if failing:
        return Verdict(FAIL, signals, "; ".join(signal["detail"] for signal in failing))
    return Verdict(PASS, signals, _pass_reason(signals))


def failing_streak(results: Iterable[str]) -> int:
    """How many windows at the end of ``results`` (oldest first) failed in a row. A
    window waiting for data neither extends nor breaks the streak; a pass ends it. The
    canary rolls back once this reaches ``failure_limit``."""
    streak = 0
    for result in results:
        if result == FAIL:
            streak += 1
        elif result == PASS:
            streak = 0
    return streak


def _signal(name: str, passed: bool | None, value: object, stable_value: object, threshold: object, detail: str, **extra) -> dict:
    """``extra``: an output signal's ``statistic`` (``"PSI"`` or ``"KS D"``), which ``value`` is."""
    return {"name": name, "passed": passed, "value": value, "stable_value": stable_value, "threshold": threshold, "detail": detail, **extra}


def _error_excess(name: str, label: str, canary_errors: int, stable_errors: int, canary: SideFigures,
                  stable: SideFigures, limit: float, alpha: float) -> dict:
    canary_rate, stable_rate = _rate(canary_errors, canary.requests), _rate(stable_errors, stable.requests)
    if canary_rate is None or stable_rate is None:
        side = "canary" if canary_rate is None else "stable"
        return _signal(name, None, canary_rate, stable_rate, limit, f"{label}: no requests on {side}")
    # One or two errors in a small window are over any small limit by chance: the excess
    # must also be significant.
    p_value = excess_proportion_p(canary_errors, canary.requests, stable_errors, stable.requests)
    worse = canary_rate - stable_rate > limit + _TOLERANCE and p_value < alpha
    detail = (f"{label} {_percent(canary_rate)} on canary vs {_percent(stable_rate)} on stable "
              f"(allowed excess {_percent(limit)}, p {p_value:.2g})")
    return _signal(name, not worse, canary_rate, stable_rate, limit, detail)


def _latency_p99(canary: SideFigures, stable: SideFigures, settings: AnalysisSettings) -> dict:
    canary_ms, stable_ms = _p99_ms(canary.latency_buckets), _p99_ms(stable.latency_buckets)
    if canary_ms is None or stable_ms is None:
        side = "canary" if canary_ms is None else "stable"
        return _signal("latency_p99", None, canary_ms, stable_ms, None, f"p99 latency: no latency figures on {side}")
    # A canary p99 under the floor can never fail (ratio ≥ 1), so flooring stable's is enough.
    limit_ms = min(settings.max_latency_p99_ratio * max(stable_ms, settings.latency_p99_floor_ms), settings.max_latency_p99_ms)
    detail = (f"p99 latency {_ms(canary_ms)} on canary vs {_ms(stable_ms)} on stable (limit {_ms(limit_ms)}: "
              f"{settings.max_latency_p99_ratio:g} × the larger of stable's and {settings.latency_p99_floor_ms:g} ms, "
              f"at most {settings.max_latency_p99_ms:g} ms)")
    return _signal("latency_p99", canary_ms <= limit_ms + _TOLERANCE, canary_ms, stable_ms, limit_ms, detail)


def _p99_ms(buckets: dict[str, int]) -> float | None:
    seconds = histogram_quantile(buckets, 0.99) if buckets else None
    return None if seconds is None else seconds * 1000


def _output_signals(canary: SideFigures, stable: SideFigures, settings: AnalysisSettings) -> list[dict]:
    signals = []
    for name, canary_output in canary.outputs.items():
        stable_output = stable.outputs.get(name)
        if stable_output is None:
            continue
        if canary_output.kind != stable_output.kind:
            detail = f"output {name}: {canary_output.kind} on canary but {stable_output.kind} on stable, not comparable"
            signals.append(_signal(f"output:{name}", None, None, None, None, detail))
        elif isinstance(canary_output, ClassCounts):
            signals.append(_class_signal(name, canary_output, stable_output, settings))
        else:
            signals.append(_value_signal(name, canary_output, stable_output, settings))
            if canary_output.non_finite:
                signals.append(_non_finite_signal(name, canary_output, stable_output, settings))
    return signals


def _non_finite_signal(name: str, canary: ValueFigures, stable: ValueFigures, settings: AnalysisSettings) -> dict:
    """NaN or ±inf in a canary's outputs: answers the client got with a 200 that are no
    answer, so held to the server-error limit (excess over stable's share, significant).
    Shown only when the canary has any: a model that starts emitting NaN may move no other
    signal (its finite values can be few or unchanged)."""
    canary_total, stable_total = canary.count + canary.non_finite, stable.count + stable.non_finite
    label, threshold = f"non-finite values of output {name}", settings.max_server_error_excess
    if stable_total == 0:
        return _signal(f"output:{name}:non_finite", None, canary.non_finite / canary_total, None, threshold, f"{label}: none reported on stable")
    canary_share, stable_share = canary.non_finite / canary_total, stable.non_finite / stable_total
    p_value = excess_proportion_p(canary.non_finite, canary_total, stable.non_finite, stable_total)
    worse = canary_share - stable_share > threshold + _TOLERANCE and p_value < settings.alpha
    detail = (f"{label} {_percent(canary_share)} on canary vs {_percent(stable_share)} on stable "
              f"(allowed excess {_percent(threshold)}, p {p_value:.2g})")
    return _signal(f"output:{name}:non_finite", not worse, canary_share, stable_share, threshold, detail)


def _too_few_outputs(name: str, canary_total: int, stable_total: int, needed: int) -> str | None:
    if canary_total >= needed and stable_total >= needed:
        return None
    return f"output {name}: {canary_total} outputs on canary and {stable_total} on stable, {needed} needed on each side"


def _class_signal(name: str, canary: ClassCounts, stable: ClassCounts, settings: AnalysisSettings) -> dict:
    threshold = settings.max_class_psi
    too_few = _too_few_outputs(name, canary.total, stable.total, settings.min_requests)
    if too_few:
        return _signal(f"output:{name}", None, None, None, threshold, too_few, statistic="PSI")
    canary_counts, stable_counts = _class_vectors(canary, stable)
    index = psi(stable_counts, canary_counts)
    _, _, p_value = chi_square_homogeneity(canary_counts, stable_counts)
    # PSI alone cannot tell a shift from the noise of a small window (with k classes and
    # n requests its noise is about (k - 1) / n): the shift must also be significant.
    shifted = index > threshold + _TOLERANCE and p_value < settings.alpha
    detail = (f"output {name}: PSI {index:.3f} (limit {threshold:g}), chi-square p {p_value:.2g} (significant below {settings.alpha:g}), "
              f"JS distance {js_distance(stable_counts, canary_counts):.3f}, "
              f"class shares canary/stable [{_top_shares(canary_counts, stable_counts)}]")
    return _signal(f"output:{name}", not shifted, index, None, threshold, detail, statistic="PSI")


def _class_vectors(canary: ClassCounts, stable: ClassCounts) -> tuple[list[int], list[int]]:
    """Both sides' counts over the same classes, with ``other`` as one more class last."""
    length = max(len(canary.counts), len(stable.counts))
    return ([*canary.counts, *[0] * (length - len(canary.counts)), canary.other],
            [*stable.counts, *[0] * (length - len(stable.counts)), stable.other])


def _top_shares(canary_counts: list[int], stable_counts: list[int]) -> str:
    canary_total, stable_total = sum(canary_counts), sum(stable_counts)
    shares = [(canary_count / canary_total, stable_count / stable_total)
              for canary_count, stable_count in zip(canary_counts, stable_counts, strict=True)]
    labels = [str(index) for index in range(len(shares) - 1)] + ["other"]
    shown = sorted(range(len(shares)), key=lambda index: -(shares[index][0] + shares[index][1]))[:_SHOWN_CLASSES]
    return ", ".join(f"{labels[index]} {_percent(shares[index][0])}/{_percent(shares[index][1])}" for index in shown)


def _value_signal(name: str, canary: ValueFigures, stable: ValueFigures, settings: AnalysisSettings) -> dict:
    threshold = settings.max_value_ks
    too_few = _too_few_outputs(name, canary.count, stable.count, settings.min_requests)
    if too_few or not canary.sample or not stable.sample:
        return _signal(f"output:{name}", None, None, None, threshold, too_few or f"output {name}: no sampled values on one side",
                       statistic="KS D")
    statistic, p_value = ks_two_sample(canary.sample, stable.sample)
    differs = statistic > threshold + _TOLERANCE and p_value < settings.alpha
    detail = (f"output {name}: KS D {statistic:.3f} (limit {threshold:g}), p {p_value:.2g} (significant below {settings.alpha:g}), "
              f"mean {_number(canary.mean)} on canary vs {_number(stable.mean)} on stable")
    return _signal(f"output:{name}", not differs, statistic, None, threshold, detail, statistic="KS D")


def _shadow_signals(canary: SideFigures, settings: AnalysisSettings) -> list[dict]:
    shadow, needed, threshold = canary.shadow, settings.min_shadow_compared, settings.min_shadow_agreement
    if shadow is None:
        return []
    if shadow.compared < needed:
        detail = f"shadow agreement: {shadow.compared} answers compared, {needed} needed"
        return [_signal("shadow_agreement", None, _rate(shadow.agreed, shadow.compared), None, threshold, detail)]
    agreement = shadow.agreed / shadow.compared
    detail = f"shadow agreement {_percent(agreement)} of {shadow.compared} answers compared (at least {_percent(threshold)} needed)"
    return [_signal("shadow_agreement", agreement >= threshold - _TOLERANCE, agreement, None, threshold, detail)]


def _quiet_side(label: str, side: SideFigures, needed: int) -> str:
    text = f"{label} had {side.requests} request{'' if side.requests == 1 else 's'} in the window, {needed} needed"
    if label == "stable" and side.requests == 0:
        text += " (does the step give stable no traffic?)"
    return text


def _unjudged(signal: dict) -> dict:
    if signal["passed"] is None:
        return signal
    return {**signal, "passed": None, "detail": signal["detail"] + " (not judged: too few requests in the window)"}


def _pass_reason(signals: list[dict]) -> str:
    judged = [signal["name"] for signal in signals if signal["passed"]]
    unjudged = [signal["name"] for signal in signals if signal["passed"] is None]
    reason = f"every judged signal passed ({', '.join(judged)})"
    return reason + (f"; not judged: {', '.join(unjudged)}" if unjudged else "")


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole > 0 else None


def _percent(share: float) -> str:
    text = f"{share:.1%}"
    # A small nonzero share keeps two significant digits instead of reading as 0.0%.
    return text if share == 0 or text != "0.0%" else f"{share * 100:.2g}%"


def _ms(value: float) -> str:
    return f"{value:.1f} ms" if value >= 10 else f"{value:.2f} ms"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
