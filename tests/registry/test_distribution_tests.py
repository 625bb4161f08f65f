"""The statistics of registry.domain.distribution_tests on distributions whose answers are
known: equal ones read as unchanged, shifted ones as changed at the stated thresholds, and
hand-computed values come out exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from registry.domain.distribution_tests import (
    chi_square_homogeneity,
    chi_square_survival,
    excess_proportion_p,
    histogram_quantile,
    js_distance,
    kolmogorov_survival,
    ks_two_sample,
    psi,
)

# --- PSI --------------------------------------------------------------------------------


def test_psi_of_equal_shares_is_zero():
    assert psi([30, 70], [300, 700]) == pytest.approx(0, abs=1e-12)


def test_psi_of_an_even_split_against_ninety_ten_is_the_hand_computed_index():
    # (0.9 - 0.5) ln(0.9 / 0.5) + (0.1 - 0.5) ln(0.1 / 0.5) = 0.4 ln 1.8 + 0.4 ln 5 = 0.4 ln 9
    assert psi([50, 50], [90, 10], epsilon=0) == pytest.approx(0.4 * math.log(9), rel=1e-12)


def test_psi_default_smoothing_moves_the_index_by_less_than_a_thousandth():
    assert psi([50, 50], [90, 10]) == pytest.approx(0.4 * math.log(9), abs=1e-3)


def test_psi_is_symmetric():
    assert psi([50, 50], [90, 10]) == pytest.approx(psi([90, 10], [50, 50]), rel=1e-12)


def test_psi_reads_a_small_shift_as_no_significant_change():
    assert psi([50, 50], [52, 48]) < 0.1


def test_psi_reads_an_even_split_turned_ninety_ten_as_a_significant_shift():
    assert psi([50, 50], [90, 10]) > 0.25


def test_psi_of_a_class_empty_on_one_side_is_large_but_finite():
    index = psi([50, 50], [100, 0])
    assert math.isfinite(index) and index > 0.25


def test_psi_pads_the_shorter_side_with_empty_classes():
    assert psi([50, 50], [40, 40, 20]) == psi([50, 50, 0], [40, 40, 20])


@pytest.mark.parametrize(("expected", "actual"), [([0, 0], [1, 1]), ([1, 1], []), ([1, -1], [1, 1])])
def test_psi_refuses_a_side_with_no_counts_or_a_negative_count(expected, actual):
    with pytest.raises(ValueError):
        psi(expected, actual)


# --- Jensen–Shannon distance -------------------------------------------------------------


def test_js_distance_of_equal_shares_is_zero():
    assert js_distance([1, 2, 3], [10, 20, 30]) == pytest.approx(0, abs=1e-12)


def test_js_distance_of_distributions_with_no_class_in_common_is_one():
    assert js_distance([5, 0], [0, 7]) == pytest.approx(1, rel=1e-12)


def test_js_distance_of_an_even_split_against_ninety_ten_is_the_hand_computed_distance():
    # middle (0.7, 0.3); KL in bits of each side to it, averaged, then the square root
    first = 0.5 * math.log2(0.5 / 0.7) + 0.5 * math.log2(0.5 / 0.3)
    second = 0.9 * math.log2(0.9 / 0.7) + 0.1 * math.log2(0.1 / 0.3)
    assert js_distance([50, 50], [90, 10]) == pytest.approx(math.sqrt((first + second) / 2), rel=1e-12)


def test_js_distance_is_symmetric():
    assert js_distance([50, 50, 3], [90, 10]) == pytest.approx(js_distance([90, 10], [50, 50, 3]), rel=1e-12)


def test_js_distance_refuses_a_side_with_no_counts():
    with pytest.raises(ValueError):
        js_distance([0, 0], [1, 1])


# --- Kolmogorov–Smirnov ------------------------------------------------------------------


def test_ks_of_two_identical_samples_is_zero_with_p_one():
    assert ks_two_sample([0.3, 0.1, 0.2, 0.2], [0.2, 0.3, 0.2, 0.1]) == (0.0, 1.0)


def test_ks_of_samples_that_do_not_overlap_is_one_with_the_hand_computed_p_value():
    effective_n = math.sqrt(3 * 3 / 6)
    x = effective_n + 0.12 + 0.11 / effective_n
    expected_p = 2 * sum((-1) ** (j - 1) * math.exp(-2 * j * j * x * x) for j in range(1, 50))
    statistic, p_value = ks_two_sample([1, 2, 3], [4, 5, 6])
    assert statistic == 1.0
    assert p_value == pytest.approx(expected_p, rel=1e-12)


def test_ks_statistic_is_the_largest_gap_between_the_empirical_cdfs():
    # At 2, 3 and 4 the first sample's CDF leads by 0.5 (0.5 vs 0, 0.75 vs 0.25, 1 vs 0.5).
    assert ks_two_sample([1, 2, 3, 4], [3, 4, 5, 6])[0] == 0.5


def test_ks_handles_samples_of_different_sizes():
    assert ks_two_sample([1, 2], [1, 1, 2, 2, 3, 3, 3, 3])[0] == 0.5


def test_ks_does_not_depend_on_the_order_of_the_values():
    assert ks_two_sample([3, 1, 2], [2.5, 0.5]) == ks_two_sample([1, 2, 3], [0.5, 2.5])


def test_ks_finds_two_normal_samples_a_standard_deviation_apart_different():
    rng = np.random.default_rng(7)
    statistic, p_value = ks_two_sample(rng.normal(0, 1, 500), rng.normal(1, 1, 500))
    assert p_value < 1e-6
    assert statistic > 0.2


def test_ks_rarely_rejects_two_samples_of_one_distribution():
    # At alpha 0.01 about one seed in a hundred rejects; these twenty fixed seeds are the record.
    p_values = [ks_two_sample(np.random.default_rng(seed).normal(0, 1, 500),
                              np.random.default_rng(seed + 1000).normal(0, 1, 500))[1] for seed in range(20)]
    assert sum(p > 0.01 for p in p_values) >= 19


@pytest.mark.parametrize(("a", "b"), [([], [1.0]), ([1.0], []), ([1.0, math.nan], [1.0]), ([1.0], [math.inf])])
def test_ks_refuses_an_empty_sample_or_a_non_finite_value(a, b):
    with pytest.raises(ValueError):
        ks_two_sample(a, b)


@pytest.mark.parametrize(("x", "p_value"), [(1.3581, 0.05), (1.6276, 0.01), (1.0, 0.27)])
def test_kolmogorov_survival_gives_the_tabled_values(x, p_value):
    assert kolmogorov_survival(x) == pytest.approx(p_value, abs=1e-4)


def test_kolmogorov_survival_is_one_at_zero_and_near_it():
    assert kolmogorov_survival(0) == 1.0
    assert kolmogorov_survival(0.1) == pytest.approx(1.0, abs=1e-12)
    assert kolmogorov_survival(0.01) == pytest.approx(1.0, abs=1e-12)


def test_kolmogorov_survival_is_continuous_where_its_two_series_meet():
    # The survival function falls about 0.6 per unit near 1.18, so 1e-6 apart differs by < 1e-5.
    assert kolmogorov_survival(1.18 - 1e-6) == pytest.approx(kolmogorov_survival(1.18), abs=1e-5)


# --- histogram_quantile ------------------------------------------------------------------

HAND_MADE = {"0.1": 10, "0.2": 30, "0.4": 90, "+Inf": 100}


def test_histogram_quantile_interpolates_inside_the_bucket_holding_the_rank():
    # rank 50 falls among the 60 observations of (0.2, 0.4], 20 of them in: 0.2 + 0.2 * 20 / 60
    assert histogram_quantile(HAND_MADE, 0.5) == pytest.approx(0.2 + 0.2 * 20 / 60, rel=1e-12)


def test_histogram_quantile_starts_the_first_bucket_at_zero():
    assert histogram_quantile(HAND_MADE, 0.05) == pytest.approx(0.05, rel=1e-12)


def test_histogram_quantile_answers_an_upper_bound_exactly_at_its_cumulative_count():
    assert histogram_quantile(HAND_MADE, 0.9) == pytest.approx(0.4, rel=1e-12)


def test_histogram_quantile_in_the_inf_bucket_answers_the_highest_finite_bound():
    assert histogram_quantile(HAND_MADE, 0.95) == 0.4


def test_histogram_quantile_does_not_depend_on_the_order_of_the_buckets():
    assert histogram_quantile(dict(reversed(list(HAND_MADE.items()))), 0.5) == histogram_quantile(HAND_MADE, 0.5)


def test_histogram_quantile_raises_counts_that_dip_to_their_running_maximum():
    # The dip at 0.2 reads as 10: rank 50 then lies 40 into the 80 observations of (0.2, 0.4].
    assert histogram_quantile({"0.1": 10, "0.2": 5, "0.4": 90, "+Inf": 100}, 0.5) == pytest.approx(0.2 + 0.2 * 40 / 80)


@pytest.mark.parametrize("buckets", [{}, {"0.1": 0, "+Inf": 0}, {"0.1": 5, "0.2": 10}, {"+Inf": 10}])
def test_histogram_quantile_is_none_without_observations_an_inf_bucket_or_a_finite_bound(buckets):
    assert histogram_quantile(buckets, 0.5) is None


@pytest.mark.parametrize("q", [-0.01, 1.01])
def test_histogram_quantile_refuses_a_quantile_outside_zero_to_one(q):
    with pytest.raises(ValueError):
        histogram_quantile(HAND_MADE, q)


# --- chi-square homogeneity and the two-proportion test ----------------------------------


def test_chi_square_survival_matches_the_tabled_critical_values():
    # chi-square with 1, 9 and 30 degrees of freedom at their 5 % and 1 % points
    for statistic, dof, p in [(3.841, 1, 0.05), (6.635, 1, 0.01), (16.919, 9, 0.05), (21.666, 9, 0.01), (43.773, 30, 0.05)]:
        assert chi_square_survival(statistic, dof) == pytest.approx(p, abs=2e-4)


def test_equal_class_counts_are_homogeneous():
    assert chi_square_homogeneity([50, 50, 100], [100, 100, 200]) == (0.0, 2, 1.0)


def test_a_hand_computed_two_by_two_table():
    # [30, 10] vs [10, 30]: expected 20 each, chi-square = 4 * 100 / 20 = 20 with 1 dof
    statistic, dof, p = chi_square_homogeneity([30, 10], [10, 30])
    assert (statistic, dof) == (pytest.approx(20.0), 1)
    assert p == pytest.approx(7.744e-6, rel=1e-3)


def test_classes_neither_side_has_carry_no_degree_of_freedom():
    assert chi_square_homogeneity([10, 0, 10, 0], [10, 0, 10])[1] == 1


def test_a_rate_above_the_other_is_significant_and_an_equal_one_is_not():
    assert excess_proportion_p(60, 2000, 20, 2000) < 1e-4
    assert excess_proportion_p(20, 2000, 20, 2000) == pytest.approx(0.5)
    assert excess_proportion_p(0, 100, 0, 900) == 1.0
    assert excess_proportion_p(5, 100, 50, 100) > 0.99  # lower, not higher


def test_the_two_proportion_test_is_the_textbook_z():
    # 0.3 vs 0.2 of 100 each: pooled 0.25, z = 0.1 / sqrt(0.25 * 0.75 * 0.02) = 1.633
    assert excess_proportion_p(30, 100, 20, 100) == pytest.approx(0.0512, abs=5e-4)


def test_one_class_on_both_sides_has_nothing_to_test():
    assert chi_square_homogeneity([40], [7, 0, 0]) == (0.0, 0, 1.0)


@pytest.mark.parametrize(("first", "second", "side"), [([0, 0], [1, 2], "first"), ([1, 2], [], "second"), ([1, -1], [1, 1], "first")])
def test_chi_square_refuses_an_empty_or_negative_side_naming_it(first, second, side):
    with pytest.raises(ValueError, match=f"^{side} counts"):
        chi_square_homogeneity(first, second)


def test_a_chi_square_statistic_of_zero_or_below_is_certain_and_a_large_one_is_not():
    assert chi_square_survival(0.0, 3) == 1.0
    assert chi_square_survival(0.5, 1) == pytest.approx(0.4795, abs=1e-4)  # the series branch
    assert chi_square_survival(200.0, 9) < 1e-35  # the continued fraction, far in the tail


@pytest.mark.parametrize(("a_total", "b_total"), [(0, 10), (10, 0)])
def test_the_two_proportion_test_refuses_a_side_without_observations(a_total, b_total):
    with pytest.raises(ValueError, match="each side needs at least one observation"):
        excess_proportion_p(0, a_total, 0, b_total)


def test_rates_of_one_on_both_sides_have_nothing_to_test():
    assert excess_proportion_p(10, 10, 90, 90) == 1.0


def test_one_observation_a_side_is_enough_to_test():
    assert excess_proportion_p(1, 1, 0, 1) == pytest.approx(0.0786, abs=5e-4)  # z = 1 / sqrt(0.25 * 2) = 1.414
