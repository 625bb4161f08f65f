"""What the console shows of benchmarks and evaluations: pure functions over the
results kept in ``version.metrics`` and the state of the jobs that measure them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from registry.domain.version_metrics import (
    benchmark_comparison,
    build_evaluation_table,
    change_pct,
    evaluation_cell,
    evaluation_regressions,
)


def version(number=1, status="ready", metrics=None, pk=None):
    return SimpleNamespace(number=number, status=status, metrics=metrics or {}, pk=pk or number * 10)


def benchmarked(number, *sizes):
    return version(number, metrics={"benchmark": {"sizes": [
        {"batch_size": batch, "samples_per_s": rate, "p50_ms": p99 / 2, "p99_ms": p99} for batch, rate, p99 in sizes]}})


def dataset(name="holdout", task="classification", sha256="abc", pk=7, rows=100):
    return SimpleNamespace(name=name, task=task, sha256=sha256, pk=pk, rows=rows)


def job(status, error=""):
    return SimpleNamespace(status=status, error=error)


def evaluated(number, name, sha256="abc", **figures):
    return version(number, metrics={"evaluation": {name: {"dataset_sha256": sha256, "samples": 100, **figures}}})


def test_a_candidate_is_compared_with_stable_batch_size_by_batch_size():
    candidate = benchmarked(2, (1, 1500.0, 2.0), (8, 9000.0, 4.0))
    stable = benchmarked(1, (1, 1000.0, 3.0), (8, 10000.0, 5.0))

    assert benchmark_comparison(candidate, stable) == [
        {"batch_size": 1, "samples_per_s": 1500.0, "stable_samples_per_s": 1000.0, "change_pct": 50.0, "p99_ms": 2.0, "stable_p99_ms": 3.0},
        {"batch_size": 8, "samples_per_s": 9000.0, "stable_samples_per_s": 10000.0, "change_pct": -10.0, "p99_ms": 4.0, "stable_p99_ms": 5.0},
    ]


def test_a_batch_size_measured_on_one_side_only_has_no_change():
    candidate = benchmarked(2, (1, 100.0, 1.0), (64, 800.0, 9.0))
    stable = benchmarked(1, (1, 100.0, 1.0), (32, 700.0, 8.0))

    rows = benchmark_comparison(candidate, stable)

    assert [(row["batch_size"], row["samples_per_s"], row["stable_samples_per_s"], row["change_pct"]) for row in rows] == [
        (1, 100.0, 100.0, 0.0), (32, None, 700.0, None), (64, 800.0, None, None)]


@pytest.mark.parametrize("candidate, stable", [
    (benchmarked(2, (1, 10.0, 1.0)), version(1)),
    (version(2), benchmarked(1, (1, 10.0, 1.0))),
    (benchmarked(2, (1, 10.0, 1.0)), None),
    (version(2, metrics={"benchmark": "broken"}), benchmarked(1, (1, 10.0, 1.0))),
])
def test_no_comparison_without_a_benchmark_on_both_sides(candidate, stable):
    assert benchmark_comparison(candidate, stable) == []


@pytest.mark.parametrize("value, reference, expected", [(110.0, 100.0, 10.0), (1.0, 3.0, -66.7), (5.0, 0.0, None), (None, 1.0, None), (True, 1.0, None)])
def test_change_is_percent_of_the_reference(value, reference, expected):
    assert change_pct(value, reference) == expected


def test_a_result_on_the_same_bytes_is_shown_by_its_figures():
    assert evaluation_cell(evaluated(1, "holdout", accuracy=0.93), dataset(), job("succeeded")) == {"accuracy": 0.93}
    assert evaluation_cell(evaluated(1, "holdout", mae=0.5, mse=0.4), dataset(task="regression"), None) == {"mae": 0.5, "mse": 0.4}


def test_a_result_measured_on_other_bytes_is_not_shown():
    assert evaluation_cell(evaluated(1, "holdout", sha256="old", accuracy=0.93), dataset(sha256="new"), None) is None


@pytest.mark.parametrize("state, expected", [
    (job("queued"), {"status": "queued"}),
    (job("running"), {"status": "running"}),
    (job("failed", "the .npz array 'input' has rows of shape [5]"), {"status": "failed", "error": "the .npz array 'input' has rows of shape [5]"}),
    (job("cancelled", "cancelled"), {"status": "failed", "error": "cancelled"}),
    (job("succeeded"), None),
    (None, None),
])
def test_without_a_result_a_cell_shows_where_its_job_is(state, expected):
    assert evaluation_cell(version(1), dataset(), state) == expected


def test_the_table_has_a_column_per_data_set_and_a_row_per_version_worth_showing():
    holdout, drift = dataset("holdout", pk=1), dataset("drift", task="regression", pk=2, rows=30)
    versions = [
        version(4, status="validating"),
        version(3, status="ready"),
        evaluated(2, "holdout", accuracy=0.9),
        version(1, status="rejected"),
    ]
    versions[2].status = "archived"
    jobs = {(30, 2): job("running")}

    table = build_evaluation_table([drift, holdout], versions, 3, jobs)

    assert table["datasets"] == [{"name": "drift", "task": "regression", "rows": 30}, {"name": "holdout", "task": "classification", "rows": 100}]
    assert table["rows"] == [
        {"version": 3, "status": "ready", "is_stable": True, "cells": {"drift": {"status": "running"}}},
        {"version": 2, "status": "archived", "is_stable": False, "cells": {"holdout": {"accuracy": 0.9}}},
    ]


# ---------------------------------------------------------------- regressions against the stable version


def test_a_candidate_evaluated_more_than_a_point_less_accurate_than_stable_is_said_so():
    candidate, stable = evaluated(2, "holdout", accuracy=0.11), evaluated(1, "holdout", accuracy=0.89)

    assert evaluation_regressions(candidate, stable, [dataset()]) == ["accuracy 11.0% on holdout, against v1's accuracy 89.0%"]


@pytest.mark.parametrize("ours, theirs", [(0.885, 0.89), (0.95, 0.89), (0.89, 0.89)])
def test_a_candidate_within_a_point_of_stable_or_better_is_not_said_worse(ours, theirs):
    assert evaluation_regressions(evaluated(2, "holdout", accuracy=ours), evaluated(1, "holdout", accuracy=theirs), [dataset()]) == []


def test_a_regression_error_more_than_five_percent_above_stable_is_said_so_and_one_within_it_is_not():
    prices = dataset("prices", task="regression")
    candidate, stable = evaluated(2, "prices", mae=0.104, mse=0.2), evaluated(1, "prices", mae=0.1, mse=0.1)

    assert evaluation_regressions(candidate, stable, [prices]) == ["MSE 0.2 on prices, against v1's MSE 0.1"]


def test_results_on_other_bytes_of_the_data_set_are_not_compared():
    candidate, stable = evaluated(2, "holdout", accuracy=0.11), evaluated(1, "holdout", sha256="older", accuracy=0.89)

    assert evaluation_regressions(candidate, stable, [dataset()]) == []


def test_a_version_without_a_result_is_not_compared():
    assert evaluation_regressions(version(2), evaluated(1, "holdout", accuracy=0.89), [dataset()]) == []
    assert evaluation_regressions(evaluated(2, "holdout", accuracy=0.11), version(1), [dataset()]) == []


def test_a_regression_error_that_was_not_finite_is_said_worse_than_a_finite_one():
    # A model answering NaN or inf has its MAE and MSE kept as null (strict JSON): the
    # worst result there is read as no result, and went to all the traffic without a word.
    prices = dataset("prices", task="regression")
    candidate, stable = evaluated(2, "prices", mae=None, mse=None), evaluated(1, "prices", mae=0.1, mse=0.02)

    assert evaluation_regressions(candidate, stable, [prices]) == [
        "MAE not finite on prices, against v1's MAE 0.1", "MSE not finite on prices, against v1's MSE 0.02"]


def test_an_accuracy_exactly_one_point_below_stable_is_not_said_worse():
    # 0.89 - 0.88 is 0.010000000000000009 in floating point: "more than a point" read a
    # drop of exactly one point as more.
    assert evaluation_regressions(evaluated(2, "holdout", accuracy=0.88), evaluated(1, "holdout", accuracy=0.89), [dataset()]) == []
