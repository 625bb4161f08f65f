"""What the console shows of the benchmark and evaluation results kept in
``version.metrics``: a candidate's throughput and latency beside the stable version's,
and every version's score on every data set of its model.

``benchmark_comparison`` and ``build_evaluation_table`` are pure: they read attributes
of the objects they are given (``metrics``, ``number``, ``status``, ``name``, ``task``,
``sha256``; a job's ``status`` and ``error``). ``evaluation_table`` only gathers those
rows for a model.
"""

from __future__ import annotations

from registry.domain.choices import JobKind, JobStatus, VersionStatus

FIGURES_BY_TASK = {"classification": ("accuracy",), "regression": ("mae", "mse")}
# How much worse than the stable version, on the same bytes of a data set, a version must
# score before the promote and 100% dialogs say so: a version at 11 % accuracy (stable
# 89 %) went to all the traffic without a word. Smaller gaps are mostly a data set's noise.
ACCURACY_DROP = 0.01  # absolute: one point
ERROR_RISE = 0.05  # relative, of MAE and MSE
# Floating point's noise, not a difference: 0.89 - 0.88 is 0.010000000000000009.
ROUNDING = 1e-9


def benchmark_comparison(version, stable_version) -> list[dict]:
    """One row per batch size either measured: samples/s and p99 of both, and the
    change in samples/s (percent of the stable's); empty when either has no benchmark."""
    mine, theirs = benchmark_sizes(version), benchmark_sizes(stable_version)
    if not mine or not theirs:
        return []
    rows = []
    for batch_size in sorted(set(mine) | set(theirs)):
        own, stable = mine.get(batch_size, {}), theirs.get(batch_size, {})
        rows.append({
            "batch_size": batch_size,
            "samples_per_s": own.get("samples_per_s"),
            "stable_samples_per_s": stable.get("samples_per_s"),
            "change_pct": change_pct(own.get("samples_per_s"), stable.get("samples_per_s")),
            "p99_ms": own.get("p99_ms"),
            "stable_p99_ms": stable.get("p99_ms"),
        })
    return rows


def benchmark_sizes(version) -> dict[int, dict]:
    """The version's benchmark by batch size ({} when it has none)."""
    benchmark = _metrics(version).get("benchmark")
    sizes = benchmark.get("sizes") if isinstance(benchmark, dict) else None
    if not isinstance(sizes, list):
        return {}
    return {size["batch_size"]: size for size in sizes
            if isinstance(size, dict) and isinstance(size.get("batch_size"), int) and not isinstance(size["batch_size"], bool)}


def change_pct(value, reference) -> float | None:
    if not _is_number(value) or not _is_number(reference) or reference <= 0:
        return None
    return round((value - reference) / reference * 100.0, 1)


def evaluation_table(model) -> dict:
    """Every data set of ``model`` as a column, every version worth a row (ready, or
    with results) newest first, each cell a result or the state of its job."""
    release = model.current_release()
    jobs = {(job.version_id, job.dataset_id): job for job in model.jobs.filter(kind=JobKind.EVALUATION).order_by("pk")}
    return build_evaluation_table(
        list(model.datasets.order_by("name")),
        list(model.versions.order_by("-number")),
        None if release is None else release.stable_version,
        jobs,
    )


def build_evaluation_table(datasets: list, versions: list, stable_number: int | None, jobs: dict) -> dict:
    """``jobs`` maps (version pk, data set pk) to that evaluation's job."""
    rows = []
    for version in versions:
        cells = {}
        for dataset in datasets:
            cell = evaluation_cell(version, dataset, jobs.get((version.pk, dataset.pk)))
            if cell is not None:
                cells[dataset.name] = cell
        if cells or version.status == VersionStatus.READY:
            rows.append({"version": version.number, "status": version.status, "is_stable": version.number == stable_number, "cells": cells})
    return {"datasets": [{"name": dataset.name, "task": dataset.task, "rows": dataset.rows} for dataset in datasets], "rows": rows}


def evaluation_cell(version, dataset, job) -> dict | None:
    """The result measured on these very bytes of the data set, else where its job is;
    None when there is neither."""
    result = _metrics(version).get("evaluation")
    result = result.get(dataset.name) if isinstance(result, dict) else None
    if isinstance(result, dict) and result.get("dataset_sha256") == dataset.sha256:
        return {figure: result.get(figure) for figure in FIGURES_BY_TASK.get(dataset.task, ())}
    if job is None or job.status == JobStatus.SUCCEEDED:
        return None
    if job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
        return {"status": job.status}
    return {"status": "failed", "error": job.error or job.status}


def evaluation_regressions(candidate, stable, datasets: list) -> list[str]:
    """Each data set both versions were measured on (the same bytes) where ``candidate``
    scored worse than ``stable`` by more than ACCURACY_DROP or ERROR_RISE, or had an error
    that was not finite where the stable's was, in words: "accuracy 11.0% on digits-test,
    against v1's accuracy 89.0%"."""
    said = []
    for dataset in datasets:
        new, old = evaluation_cell(candidate, dataset, None) or {}, evaluation_cell(stable, dataset, None) or {}
        for figure in FIGURES_BY_TASK.get(dataset.task, ()):
            ours, theirs = new.get(figure), old.get(figure)
            if not _is_number(theirs):
                continue
            if not _is_number(ours):
                # Measured, yet null: a NaN or an infinity, which results keep as null (strict JSON).
                if _measured_not_finite(candidate, dataset, figure):
                    said.append(f"{figure.upper()} not finite on {dataset.name}, against v{stable.number}'s {_figure_words(figure, theirs)}")
                continue
            if (theirs - ours > ACCURACY_DROP + ROUNDING) if figure == "accuracy" else ours > theirs * (1 + ERROR_RISE + ROUNDING):
                said.append(f"{_figure_words(figure, ours)} on {dataset.name}, against v{stable.number}'s {_figure_words(figure, theirs)}")
    return said


def _measured_not_finite(version, dataset, figure: str) -> bool:
    result = _metrics(version).get("evaluation")
    result = result.get(dataset.name) if isinstance(result, dict) else None
    return isinstance(result, dict) and result.get("dataset_sha256") == dataset.sha256 and figure in result and result[figure] is None


def _figure_words(figure: str, value: float) -> str:
    return f"accuracy {value * 100:.1f}%" if figure == "accuracy" else f"{figure.upper()} {value:.4g}"


def _metrics(version) -> dict:
    metrics = getattr(version, "metrics", None) if version is not None else None
    return metrics if isinstance(metrics, dict) else {}


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
