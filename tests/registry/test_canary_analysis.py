"""The canary judge (registry.domain.canary_analysis): its settings and their refusals, one
side's figures summed over a window, and the verdict on windows built from the figures
workers report — each signal passing and failing, quiet traffic waiting, and thresholds at
their boundary passing."""

from __future__ import annotations

import numpy as np
import pytest

from registry.domain.canary_analysis import (
    DEFAULTS,
    FAIL,
    MAX_SAMPLE,
    PASS,
    WAITING_FOR_DATA,
    AnalysisSettings,
    ClassCounts,
    InvalidAnalysis,
    ShadowFigures,
    SideFigures,
    ValueFigures,
    aggregate,
    failing_streak,
    json_schema,
    judge,
)
from registry.domain.distribution_tests import excess_proportion_p
from serving.metrics import LATENCY_BUCKETS_S

EVEN_CLASSES = [20] * 10
MOSTLY_CLASS_3 = [5, 4, 5, 160, 4, 5, 4, 5, 4, 4]  # 80 % of 200 rows


def figures(requests: int = 200, *, errors: int = 0, client_errors: int = 0, latency_s: float = 0.003,
            outputs: list | None = None, shadow: dict | None = None) -> dict:
    """One version's figures in one report, every request taking ``latency_s``."""
    buckets = {str(bound): requests if latency_s <= bound else 0 for bound in LATENCY_BUCKETS_S}
    entry = {"model": "digits", "version": 3, "requests": requests, "errors": errors, "client_errors": client_errors,
             "latency_sum_s": latency_s * requests, "latency_buckets": {**buckets, "+Inf": requests}}
    if outputs is not None:
        entry["outputs"] = outputs
    if shadow is not None:
        entry["shadow"] = shadow
    return entry


def side(**kwargs) -> SideFigures:
    return aggregate([figures(**kwargs)])


def classes(counts: list[int], name: str = "probabilities", other: int = 0) -> dict:
    return {"name": name, "kind": "classes", "counts": counts, "other": other}


def values(sample, name: str = "y", count: int | None = None) -> dict:
    sample = [float(value) for value in sample]
    return {"name": name, "kind": "values", "count": len(sample) if count is None else count, "sum": sum(sample),
            "non_finite": 0, "sample": sample}


def normal(seed: int, mean: float = 0.0, size: int = 500) -> list[float]:
    return list(np.random.default_rng(seed).normal(mean, 1.0, size))


def signal(verdict, name: str) -> dict:
    return next(found for found in verdict.signals if found["name"] == name)


def names(verdict) -> list[str]:
    return [found["name"] for found in verdict.signals]


# --- Settings ---------------------------------------------------------------------------


def test_the_defaults_are_the_documented_ones():
    assert DEFAULTS.to_json() == {
        "interval_s": 60, "min_requests": 100, "failure_limit": 2, "max_server_error_excess": 0.01,
        "max_client_error_excess": 0.02, "max_latency_p99_ratio": 2.0, "latency_p99_floor_ms": 5.0,
        "max_latency_p99_ms": 1000.0, "max_class_psi": 0.2, "max_value_ks": 0.2, "alpha": 0.01,
        "min_shadow_agreement": 0.95, "min_shadow_compared": 50,
    }


def test_parse_overrides_only_the_given_fields():
    settings = AnalysisSettings.parse({"min_requests": 500, "max_class_psi": 0.1})
    assert settings.to_json() == {**DEFAULTS.to_json(), "min_requests": 500, "max_class_psi": 0.1}


def test_parse_builds_on_the_given_base():
    base = AnalysisSettings.parse({"interval_s": 30})
    assert AnalysisSettings.parse({"failure_limit": 3}, base=base) == AnalysisSettings(interval_s=30, failure_limit=3)


def test_parse_of_nothing_keeps_the_base():
    base = AnalysisSettings(interval_s=30)
    assert AnalysisSettings.parse(None, base=base) is base
    assert AnalysisSettings.parse({}) == DEFAULTS


def test_parse_takes_an_integer_for_a_number_field_as_a_float():
    settings = AnalysisSettings.parse({"max_latency_p99_ratio": 3})
    assert settings.max_latency_p99_ratio == 3.0 and isinstance(settings.max_latency_p99_ratio, float)


@pytest.mark.parametrize(("name", "value"), [("interval_s", 1), ("interval_s", 3600), ("max_server_error_excess", 0),
                                             ("max_server_error_excess", 1), ("max_latency_p99_ratio", 1)])
def test_parse_accepts_the_ends_of_each_range(name, value):
    assert getattr(AnalysisSettings.parse({name: value}), name) == value


def test_to_json_parses_back_to_the_same_settings():
    settings = AnalysisSettings(min_requests=7, max_value_ks=0.3)
    assert AnalysisSettings.parse(settings.to_json()) == settings


@pytest.mark.parametrize("raw", [[], "min_requests=5", 3])
def test_parse_refuses_anything_but_an_object(raw):
    with pytest.raises(InvalidAnalysis, match="analysis must be a JSON object"):
        AnalysisSettings.parse(raw)


def test_parse_refuses_an_unknown_field_naming_it_and_the_known_ones():
    with pytest.raises(InvalidAnalysis, match="unknown field 'min_request'; known fields: interval_s, min_requests"):
        AnalysisSettings.parse({"min_request": 5})


@pytest.mark.parametrize(("name", "value", "allowed"), [
    ("interval_s", 0, "an integer from 1 to 3600"),
    ("interval_s", 3601, "an integer from 1 to 3600"),
    ("interval_s", 1.5, "an integer from 1 to 3600"),
    ("interval_s", "60", "an integer from 1 to 3600"),
    ("min_requests", 0, "an integer from 1 to 1e+07"),
    ("failure_limit", 101, "an integer from 1 to 100"),
    ("failure_limit", True, "an integer from 1 to 100"),
    ("max_server_error_excess", 1.5, "a number from 0 to 1"),
    ("max_client_error_excess", -0.1, "a number from 0 to 1"),
    ("max_latency_p99_ratio", 0.5, "a number from 1 to 1000"),
    ("max_latency_p99_ratio", float("inf"), "a number from 1 to 1000"),
    ("max_class_psi", float("nan"), "a number from 0 to 10"),
    ("alpha", False, "a number from 0.001 to 1"),
    ("alpha", 0, "a number from 0.001 to 1"),
    ("min_shadow_agreement", None, "a number from 0 to 1"),
])
def test_parse_refuses_a_wrong_type_or_an_out_of_range_value_naming_the_field_and_range(name, value, allowed):
    with pytest.raises(InvalidAnalysis) as refusal:
        AnalysisSettings.parse({name: value})
    assert str(refusal.value).startswith(f"analysis.{name} must be {allowed}, got ")


def test_a_refusal_echoes_only_a_short_prefix_of_the_value():
    with pytest.raises(InvalidAnalysis) as refusal:
        AnalysisSettings.parse({"interval_s": "x" * 1000})
    assert len(str(refusal.value)) < 100


def test_settings_built_directly_are_checked_too():
    with pytest.raises(InvalidAnalysis, match="analysis.min_requests"):
        AnalysisSettings(min_requests=0)


# --- aggregate ---------------------------------------------------------------------------


def test_aggregate_sums_requests_errors_and_latency_buckets_over_the_window():
    window = aggregate([figures(100, errors=1, client_errors=2, latency_s=0.003), figures(50, errors=2, latency_s=0.3)])
    assert (window.requests, window.server_errors, window.client_errors) == (150, 3, 2)
    assert window.latency_sum_s == pytest.approx(0.3 + 15.0)
    assert (window.latency_buckets["0.002"], window.latency_buckets["0.004"], window.latency_buckets["0.512"]) == (0, 100, 150)
    assert window.latency_buckets["+Inf"] == 150


def test_aggregate_of_no_reports_is_an_empty_side():
    assert aggregate([]) == SideFigures()


def test_aggregate_sums_class_counts_index_wise_across_lengths():
    window = aggregate([figures(outputs=[classes([1, 2], other=1)]), figures(outputs=[classes([10, 20, 30])])])
    assert window.outputs == {"probabilities": ClassCounts(counts=[11, 22, 30], other=1)}


def test_aggregate_sums_value_counts_and_concatenates_their_samples():
    window = aggregate([figures(outputs=[values([1, 2], count=5)]), figures(outputs=[values([3])])])
    assert window.outputs == {"y": ValueFigures(count=6, sum=6.0, non_finite=0, sample=[1.0, 2.0, 3.0])}


def test_aggregate_thins_a_long_sample_evenly_and_the_same_way_every_time():
    reports = [figures(outputs=[values(range(start, start + 64))]) for start in range(0, 64 * 100, 64)]
    sample = aggregate(reports).outputs["y"].sample
    assert len(sample) == MAX_SAMPLE
    assert sample == aggregate(reports).outputs["y"].sample
    assert sample[0] == 0 and sample[-1] > 6300  # spread over the whole window, not its start


def test_aggregate_skips_an_output_whose_kind_changes_between_reports():
    window = aggregate([figures(outputs=[classes([1, 2], name="out")]), figures(outputs=[values([5.0], name="out")])])
    assert window.outputs == {"out": ClassCounts(counts=[1, 2])}


def test_aggregate_sums_shadow_counts_and_leaves_none_when_no_report_has_them():
    shadow = {"compared": 50, "agreed": 48, "errors": 1, "dropped": 2}
    assert aggregate([figures(shadow=shadow), figures(), figures(shadow=shadow)]).shadow == ShadowFigures(100, 96, 2, 4)
    assert aggregate([figures()]).shadow is None


def test_aggregate_reads_reports_without_outputs_and_ignores_keys_it_does_not_know():
    window = aggregate([{**figures(120), "queue_depth": 3, "batch_buckets": {"1": 4}}])
    assert (window.requests, window.outputs, window.shadow) == (120, {}, None)


# --- judge: the whole window -------------------------------------------------------------


def full(seed: int) -> SideFigures:
    return side(outputs=[classes(EVEN_CLASSES), values(normal(seed))],
                shadow={"compared": 200, "agreed": 200, "errors": 0, "dropped": 0})


def test_equal_figures_pass_every_signal():
    verdict = judge(full(1), full(1), DEFAULTS)
    assert verdict.result == PASS
    assert names(verdict) == ["server_errors", "client_errors", "latency_p99", "output:probabilities", "output:y", "shadow_agreement"]
    assert [found["passed"] for found in verdict.signals] == [True] * 6
    assert verdict.reason.startswith("every judged signal passed (server_errors, client_errors, latency_p99")


def test_a_quiet_canary_waits_and_says_how_many_requests_were_needed():
    verdict = judge(side(requests=12), side(), DEFAULTS)
    assert verdict.result == WAITING_FOR_DATA
    assert verdict.reason == "canary had 12 requests in the window, 100 needed"


def test_a_waiting_window_still_shows_the_signals_but_judges_none():
    verdict = judge(side(requests=12, client_errors=12), side(), DEFAULTS)
    assert signal(verdict, "client_errors")["value"] == 1.0
    assert [found["passed"] for found in verdict.signals] == [None, None, None]


def test_a_quiet_stable_version_waits_too():
    assert judge(side(), side(requests=1), DEFAULTS).reason == "stable had 1 request in the window, 100 needed"


def test_a_stable_version_without_traffic_waits():
    verdict = judge(side(), aggregate([]), DEFAULTS)
    assert verdict.result == WAITING_FOR_DATA
    assert verdict.reason.startswith("stable had 0 requests in the window, 100 needed")


def test_exactly_min_requests_on_each_side_is_enough_for_a_verdict():
    assert judge(side(requests=100), side(requests=100), DEFAULTS).result == PASS


def test_the_reason_lists_every_failing_signal():
    verdict = judge(side(errors=100, client_errors=100), side(), DEFAULTS)
    p = excess_proportion_p(100, 200, 0, 200)
    assert verdict.reason == (f"server errors 50.0% on canary vs 0.0% on stable (allowed excess 1.0%, p {p:.2g}); "
                              f"client errors 50.0% on canary vs 0.0% on stable (allowed excess 2.0%, p {p:.2g})")


def test_a_window_failing_every_signal_names_each_once_in_the_reason():
    canary = side(errors=10, client_errors=200, latency_s=0.02, outputs=[classes(MOSTLY_CLASS_3), values(normal(1, mean=1.0))],
                  shadow={"compared": 100, "agreed": 80, "errors": 0, "dropped": 0})
    verdict = judge(canary, side(outputs=[classes(EVEN_CLASSES), values(normal(2))]), DEFAULTS)
    assert [found["passed"] for found in verdict.signals] == [False] * 6
    assert verdict.reason.split("; ") == [found["detail"] for found in verdict.signals]


def test_the_verdict_as_json_has_result_reason_and_every_signal():
    verdict = judge(side(), side(), DEFAULTS)
    data = verdict.to_json()
    assert data["result"] == PASS and data["reason"] == verdict.reason
    assert data["signals"][0] == {"name": "server_errors", "passed": True, "value": 0.0, "stable_value": 0.0, "threshold": 0.01,
                                  "detail": "server errors 0.0% on canary vs 0.0% on stable (allowed excess 1.0%, p 1)"}


# --- judge: error rates ------------------------------------------------------------------


def test_a_canary_answering_only_client_errors_fails_client_errors_while_server_errors_pass():
    verdict = judge(side(client_errors=200), side(), DEFAULTS)
    assert verdict.result == FAIL
    assert (signal(verdict, "client_errors")["passed"], signal(verdict, "server_errors")["passed"]) == (False, True)
    assert verdict.reason == f"client errors 100.0% on canary vs 0.0% on stable (allowed excess 2.0%, p {excess_proportion_p(200, 200, 0, 200):.2g})"


def test_server_errors_fail_on_an_excess_over_the_limit():
    verdict = judge(side(requests=2000, errors=60), side(requests=2000, errors=20), DEFAULTS)  # 3.0 % vs 1.0 %
    assert signal(verdict, "server_errors")["passed"] is False
    p = excess_proportion_p(60, 2000, 20, 2000)
    assert p < 1e-4
    assert verdict.reason == f"server errors 3.0% on canary vs 1.0% on stable (allowed excess 1.0%, p {p:.2g})"


def test_an_excess_that_chance_explains_passes():
    # 3 % vs 1 % again, but of 200 requests: six errors against two is p ≈ 0.08, noise.
    verdict = judge(side(errors=6), side(errors=2), DEFAULTS)
    found = signal(verdict, "server_errors")
    assert found["passed"] is True and "p 0.077" in found["detail"]


def test_one_error_in_a_small_window_does_not_fail_a_step():
    assert signal(judge(side(requests=100, errors=1), side(requests=900), DEFAULTS), "server_errors")["passed"] is True


def test_error_rates_as_high_as_stable_pass():
    verdict = judge(side(errors=20, client_errors=40), side(errors=20, client_errors=40), DEFAULTS)
    assert verdict.result == PASS


@pytest.mark.parametrize(("name", "field", "canary_errors", "passed"), [
    ("server_errors", "errors", 700, True), ("server_errors", "errors", 800, False),
    ("client_errors", "client_errors", 800, True), ("client_errors", "client_errors", 900, False),
])
def test_an_error_excess_exactly_at_its_limit_passes(name, field, canary_errors, passed):
    # 7 % - 6 % and 8 % - 6 % come out a rounding error above 1 % and 2 % in floating point;
    # 10,000 requests a side make every excess here significant.
    verdict = judge(side(requests=10_000, **{field: canary_errors}), side(requests=10_000, **{field: 600}), DEFAULTS)
    assert signal(verdict, name)["passed"] is passed


# --- judge: latency ----------------------------------------------------------------------


def test_a_canary_p99_over_twice_stables_fails_latency():
    # every stable request in (4, 8] ms: p99 7.96 ms; canary in (16, 32] ms: p99 31.84 ms
    verdict = judge(side(latency_s=0.020), side(latency_s=0.006), DEFAULTS)
    found = signal(verdict, "latency_p99")
    assert (found["passed"], found["value"], found["stable_value"], found["threshold"]) == (
        False, pytest.approx(31.84), pytest.approx(7.96), pytest.approx(15.92))
    assert verdict.reason == ("p99 latency 31.8 ms on canary vs 7.96 ms on stable (limit 15.9 ms: "
                              "2 × the larger of stable's and 5 ms, at most 1000 ms)")


def test_a_canary_p99_exactly_twice_stables_passes_latency():
    # canary in (8, 16] ms: p99 15.92 ms, twice stable's 7.96 ms
    assert signal(judge(side(latency_s=0.012), side(latency_s=0.006), DEFAULTS), "latency_p99")["passed"] is True


def test_a_canary_faster_than_stable_passes_latency():
    assert signal(judge(side(latency_s=0.006), side(latency_s=0.012), DEFAULTS), "latency_p99")["passed"] is True


def test_a_stable_p99_under_the_floor_compares_as_the_floor():
    # stable p99 0.5 ms, canary 3.98 ms: eight times slower, but under 2 × the 5 ms floor
    verdict = judge(side(latency_s=0.003), side(latency_s=0.0004), DEFAULTS)
    assert signal(verdict, "latency_p99")["passed"] is True
    assert signal(verdict, "latency_p99")["threshold"] == 10.0


def test_without_a_floor_sub_millisecond_latencies_compare_by_ratio():
    settings = AnalysisSettings(latency_p99_floor_ms=0)
    assert signal(judge(side(latency_s=0.003), side(latency_s=0.0004), settings), "latency_p99")["passed"] is False


def test_a_canary_p99_over_the_ceiling_fails_even_when_stable_is_as_slow():
    verdict = judge(side(latency_s=0.003), side(latency_s=0.003), AnalysisSettings(max_latency_p99_ms=3))
    assert signal(verdict, "latency_p99")["passed"] is False
    assert signal(verdict, "latency_p99")["threshold"] == 3.0


@pytest.mark.parametrize(("ceiling_ms", "passed"), [(15.92, True), (15.91, False)])
def test_a_canary_p99_exactly_at_its_limit_passes(ceiling_ms, passed):
    settings = AnalysisSettings(max_latency_p99_ms=ceiling_ms)
    assert signal(judge(side(latency_s=0.012), side(latency_s=0.012), settings), "latency_p99")["passed"] is passed


def test_latency_is_not_judged_without_a_histogram():
    canary = side()
    canary.latency_buckets = {}
    found = signal(judge(canary, side(), DEFAULTS), "latency_p99")
    assert (found["passed"], found["detail"]) == (None, "p99 latency: no latency figures on canary")


# --- judge: class outputs ----------------------------------------------------------------


def test_a_canary_predicting_one_class_for_most_rows_fails_its_output_with_psi_in_the_reason():
    verdict = judge(side(outputs=[classes(MOSTLY_CLASS_3)]), side(outputs=[classes(EVEN_CLASSES)]), DEFAULTS)
    found = signal(verdict, "output:probabilities")
    assert verdict.result == FAIL and found["passed"] is False
    assert found["value"] > 1.0
    assert verdict.reason.startswith(f"output probabilities: PSI {found['value']:.3f} (limit 0.2), chi-square p ")
    assert "class shares canary/stable [3 80.0%/10.0%, " in verdict.reason


def test_class_shares_of_a_small_window_that_differ_by_chance_pass():
    # 30 canary rows against 270: the same ten classes sampled twice give a PSI near
    # (k - 1)(1/n + 1/m) ≈ 0.33 (0.35 for this seed), over the limit, but the chi-square
    # test calls it noise.
    rng = np.random.default_rng(5)
    canary, stable = (np.bincount(rng.integers(0, 10, size), minlength=10).tolist() for size in (30, 270))
    found = signal(judge(side(requests=30, outputs=[classes(canary)]), side(requests=270, outputs=[classes(stable)]),
                         AnalysisSettings(min_requests=20)), "output:probabilities")
    assert found["value"] > 0.2 and found["passed"] is True


def test_class_shares_that_barely_move_pass():
    shifted = [22, 18, 20, 21, 19, 20, 20, 20, 21, 19]
    assert signal(judge(side(outputs=[classes(shifted)]), side(outputs=[classes(EVEN_CLASSES)]), DEFAULTS),
                  "output:probabilities")["passed"] is True


def test_classes_past_the_reported_ones_count_as_one_more_class():
    verdict = judge(side(outputs=[classes([100, 0], other=100)]), side(outputs=[classes([100, 100])]), DEFAULTS)
    assert signal(verdict, "output:probabilities")["passed"] is False
    assert "other 50.0%/0.0%" in verdict.reason


@pytest.mark.parametrize("nudge", [0.0, -1e-6])
def test_a_psi_exactly_at_its_limit_passes(nudge):
    canary, stable = side(outputs=[classes(MOSTLY_CLASS_3)]), side(outputs=[classes(EVEN_CLASSES)])
    index = signal(judge(canary, stable, DEFAULTS), "output:probabilities")["value"]
    verdict = judge(canary, stable, AnalysisSettings(max_class_psi=index + nudge))
    assert signal(verdict, "output:probabilities")["passed"] is (nudge == 0)


def test_an_output_with_too_few_rows_on_a_side_is_not_judged():
    verdict = judge(side(outputs=[classes([90, 0])]), side(outputs=[classes(EVEN_CLASSES)]), DEFAULTS)
    found = signal(verdict, "output:probabilities")
    assert (found["passed"], found["detail"]) == (
        None, "output probabilities: 90 outputs on canary and 200 on stable, 100 needed on each side")
    assert verdict.result == PASS


def test_an_output_on_one_side_only_is_no_signal():
    verdict = judge(side(outputs=[classes(EVEN_CLASSES)]), side(), DEFAULTS)
    assert names(verdict) == ["server_errors", "client_errors", "latency_p99"]


def test_an_output_of_different_kinds_on_the_two_sides_is_not_judged():
    verdict = judge(side(outputs=[classes(EVEN_CLASSES, name="y")]), side(outputs=[values(normal(1))]), DEFAULTS)
    assert signal(verdict, "output:y")["passed"] is None


# --- judge: value outputs ----------------------------------------------------------------


def test_values_shifted_by_a_standard_deviation_fail_their_output_with_ks_in_the_reason():
    stable_values = normal(2)
    mean = sum(stable_values) / len(stable_values)
    verdict = judge(side(outputs=[values([value + 1 for value in stable_values])]), side(outputs=[values(stable_values)]), DEFAULTS)
    found = signal(verdict, "output:y")
    assert found["passed"] is False and found["value"] > 0.2
    assert verdict.reason.startswith(f"output y: KS D {found['value']:.3f} (limit 0.2), p ")
    assert verdict.reason.endswith(f"(significant below 0.01), mean {mean + 1:.4g} on canary vs {mean:.4g} on stable")


def test_values_of_one_distribution_pass():
    assert signal(judge(side(outputs=[values(normal(1))]), side(outputs=[values(normal(2))]), DEFAULTS), "output:y")["passed"] is True


def test_a_large_ks_distance_on_a_tiny_sample_is_not_significant_and_passes():
    # D = 1 on three values a side: p 0.03, not below 0.01
    verdict = judge(side(outputs=[values([4, 5, 6], count=200)]), side(outputs=[values([1, 2, 3], count=200)]), DEFAULTS)
    assert (signal(verdict, "output:y")["value"], signal(verdict, "output:y")["passed"]) == (1.0, True)


def test_a_significant_but_small_ks_distance_passes():
    verdict = judge(side(outputs=[values(normal(1, mean=0.1, size=4000))]), side(outputs=[values(normal(2, size=4000))]), DEFAULTS)
    assert signal(verdict, "output:y")["value"] < 0.2
    assert signal(verdict, "output:y")["passed"] is True


@pytest.mark.parametrize("nudge", [0.0, -1e-6])
def test_a_ks_distance_exactly_at_its_limit_passes(nudge):
    canary, stable = side(outputs=[values(normal(1, mean=1.0))]), side(outputs=[values(normal(2))])
    statistic = signal(judge(canary, stable, DEFAULTS), "output:y")["value"]
    verdict = judge(canary, stable, AnalysisSettings(max_value_ks=statistic + nudge))
    assert signal(verdict, "output:y")["passed"] is (nudge == 0)


def test_values_with_too_few_outputs_are_not_judged():
    verdict = judge(side(outputs=[values(normal(1, size=99))]), side(outputs=[values(normal(2))]), DEFAULTS)
    assert signal(verdict, "output:y")["passed"] is None


# --- judge: shadow agreement ---------------------------------------------------------------


def shadowed(compared: int, agreed: int) -> SideFigures:
    return side(shadow={"compared": compared, "agreed": agreed, "errors": 0, "dropped": 0})


def test_a_shadow_agreeing_too_rarely_fails():
    verdict = judge(shadowed(100, 80), side(), DEFAULTS)
    assert signal(verdict, "shadow_agreement")["passed"] is False
    assert verdict.reason == "shadow agreement 80.0% of 100 answers compared (at least 95.0% needed)"


@pytest.mark.parametrize(("agreed", "passed"), [(95, True), (94, False)])
def test_a_shadow_agreement_exactly_at_its_minimum_passes(agreed, passed):
    assert signal(judge(shadowed(100, agreed), side(), DEFAULTS), "shadow_agreement")["passed"] is passed


@pytest.mark.parametrize(("compared", "judged"), [(49, False), (50, True)])
def test_shadow_agreement_is_judged_from_min_shadow_compared(compared, judged):
    found = signal(judge(shadowed(compared, 0), side(), DEFAULTS), "shadow_agreement")
    assert found["passed"] is (False if judged else None)


def test_a_canary_without_shadow_figures_has_no_shadow_signal():
    assert "shadow_agreement" not in names(judge(side(), side(), DEFAULTS))


# --- failing_streak -------------------------------------------------------------------------


@pytest.mark.parametrize(("results", "streak"), [
    ([], 0),
    ([FAIL], 1),
    ([FAIL, FAIL], 2),
    ([FAIL, PASS, FAIL], 1),
    ([FAIL, WAITING_FOR_DATA, FAIL], 2),
    ([FAIL, FAIL, PASS], 0),
    ([FAIL, FAIL, WAITING_FOR_DATA], 2),
])
def test_failing_streak_counts_the_last_failures_in_a_row_ignoring_waiting_windows(results, streak):
    assert failing_streak(results) == streak



# --- judge: non-finite output values ------------------------------------------------------


def with_non_finite(sample, non_finite: int) -> dict:
    output = values(sample)
    output["non_finite"] = non_finite
    return output


def test_a_canary_emitting_nan_fails_on_its_non_finite_share_though_its_finite_values_look_the_same():
    verdict = judge(side(outputs=[with_non_finite(normal(2), 300)]), side(outputs=[values(normal(2))]), DEFAULTS)
    found = signal(verdict, "output:y:non_finite")
    assert (found["passed"], found["value"], found["stable_value"]) == (False, pytest.approx(300 / 800), 0.0)
    assert signal(verdict, "output:y")["passed"] is True
    assert verdict.reason.startswith("non-finite values of output y 37.5% on canary vs 0.0% on stable (allowed excess 1.0%, p ")


def test_a_non_finite_share_like_stables_passes_and_none_shows_no_signal():
    same = judge(side(outputs=[with_non_finite(normal(1), 50)]), side(outputs=[with_non_finite(normal(2), 50)]), DEFAULTS)
    clean = judge(side(outputs=[values(normal(1))]), side(outputs=[with_non_finite(normal(2), 50)]), DEFAULTS)
    assert signal(same, "output:y:non_finite")["passed"] is True
    assert [found["name"] for found in clean.signals if found["name"].endswith(":non_finite")] == []


def test_the_non_finite_signal_carries_both_shares_and_its_limit():
    found = signal(judge(side(outputs=[with_non_finite(normal(1, size=450), 50)]), side(outputs=[with_non_finite(normal(2, size=490), 10)]),
                         DEFAULTS), "output:y:non_finite")
    assert (found["value"], found["stable_value"], found["threshold"]) == (pytest.approx(0.1), pytest.approx(0.02), 0.01)
    assert found["passed"] is False


def test_a_non_finite_excess_that_chance_explains_passes():
    # 2 of 102 against 0 of 100: an excess of 2 %, over the 1 % limit, but p ≈ 0.08
    found = signal(judge(side(outputs=[with_non_finite(normal(1, size=100), 2)]), side(outputs=[values(normal(2, size=100))]),
                         DEFAULTS), "output:y:non_finite")
    assert found["passed"] is True


def test_a_non_finite_excess_exactly_at_its_limit_passes():
    # 11 % vs 10 % of 10,000 values: exactly the 1 % limit, and significant
    canary = with_non_finite(normal(1, size=500), 1_100)
    canary["count"] = 8_900
    stable = with_non_finite(normal(2, size=500), 1_000)
    stable["count"] = 9_000
    found = signal(judge(side(outputs=[canary]), side(outputs=[stable]), DEFAULTS), "output:y:non_finite")
    assert found["passed"] is True


def test_non_finite_values_with_nothing_on_stable_to_compare_are_not_judged():
    only_nan = {"name": "y", "kind": "values", "count": 0, "sum": 0.0, "non_finite": 200, "sample": []}
    empty = {"name": "y", "kind": "values", "count": 0, "sum": 0.0, "non_finite": 0, "sample": []}
    found = signal(judge(side(outputs=[only_nan]), side(outputs=[empty]), DEFAULTS), "output:y:non_finite")
    assert (found["passed"], found["value"], found["stable_value"], found["threshold"]) == (None, 1.0, None, 0.01)
    assert found["detail"] == "non-finite values of output y: none reported on stable"


# --- a window's totals, a shadow's window, the schema ------------------------------------


def test_a_windows_summary_has_its_totals_rates_and_p99():
    window = side(requests=200, errors=10, client_errors=30, latency_s=0.006,
                  shadow={"compared": 40, "agreed": 38, "errors": 1, "dropped": 2})
    assert window.summary() == {
        "requests": 200, "server_errors": 10, "client_errors": 30, "server_error_rate": 0.05, "client_error_rate": 0.15,
        "p99_ms": pytest.approx(7.96), "shadow": {"compared": 40, "agreed": 38, "errors": 1, "dropped": 2},
    }


def test_a_quiet_windows_summary_has_no_rates_and_no_shadow():
    assert SideFigures().summary() == {"requests": 0, "server_errors": 0, "client_errors": 0, "server_error_rate": None,
                                       "client_error_rate": None, "p99_ms": None, "shadow": None}


def test_a_shadow_window_reads_its_mirrored_runs_as_requests_and_their_failures_as_server_errors():
    window = side(requests=0, outputs=[classes(EVEN_CLASSES)], shadow={"compared": 150, "agreed": 140, "errors": 7, "dropped": 30})
    shadow = window.as_shadow()
    assert (shadow.requests, shadow.server_errors, shadow.client_errors, shadow.latency_buckets) == (157, 7, 0, {})
    assert shadow.outputs == window.outputs and shadow.shadow == window.shadow


def test_a_window_that_was_never_a_shadow_reads_as_no_runs():
    assert SideFigures(requests=300).as_shadow().requests == 0


def test_the_json_schema_lists_every_threshold_with_its_type_and_range_and_nothing_else():
    schema = json_schema()
    assert (schema["type"], schema["additionalProperties"]) == ("object", False)
    assert set(schema["properties"]) == set(DEFAULTS.to_json())
    assert schema["properties"]["interval_s"] == {"type": "integer", "minimum": 1, "maximum": 3600}
    assert schema["properties"]["alpha"] == {"type": "number", "minimum": 0.001, "maximum": 1}


# --- what a signal says when a side has nothing -------------------------------------------


@pytest.mark.parametrize(("canary_requests", "stable_requests", "empty", "values"), [(0, 200, "canary", (None, 0.0)), (200, 0, "stable", (0.0, None))])
def test_an_error_signal_with_no_requests_on_one_side_is_not_judged_and_names_that_side(canary_requests, stable_requests, empty, values):
    verdict = judge(side(requests=canary_requests), side(requests=stable_requests), DEFAULTS)
    for name, label, limit in (("server_errors", "server errors", 0.01), ("client_errors", "client errors", 0.02)):
        found = signal(verdict, name)
        assert (found["passed"], (found["value"], found["stable_value"]), found["threshold"]) == (None, values, limit)
        assert found["detail"].startswith(f"{label}: no requests on {empty}")


def test_output_signals_name_their_statistic_judged_or_not():
    judged = judge(side(outputs=[classes(EVEN_CLASSES), values(normal(1))]), side(outputs=[classes(EVEN_CLASSES), values(normal(2))]), DEFAULTS)
    quiet = judge(side(requests=10, outputs=[classes([1] * 10), values(normal(1, size=10))]),
                  side(requests=10, outputs=[classes([1] * 10), values(normal(2, size=10))]), DEFAULTS)
    for verdict in (judged, quiet):
        assert (signal(verdict, "output:probabilities")["statistic"], signal(verdict, "output:y")["statistic"]) == ("PSI", "KS D")
        assert (signal(verdict, "output:probabilities")["threshold"], signal(verdict, "output:y")["threshold"]) == (0.2, 0.2)


def test_a_values_output_with_no_sample_on_one_side_is_not_judged_and_says_so():
    unsampled = {"name": "y", "kind": "values", "count": 500, "sum": 10.0, "non_finite": 0, "sample": []}
    for canary, stable in ((unsampled, values(normal(2))), (values(normal(1)), unsampled)):
        found = signal(judge(side(outputs=[canary]), side(outputs=[stable]), DEFAULTS), "output:y")
        assert (found["passed"], found["value"], found["threshold"], found["statistic"]) == (None, None, 0.2, "KS D")
        assert found["detail"] == "output y: no sampled values on one side"
