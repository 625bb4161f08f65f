"""What the console shows of a version's measured metrics: the headline numbers beside
each version, its benchmark beside the stable version's, and its evaluation per data set.

The numbers are the benchmark and evaluation jobs' results, stored in ``version.metrics``
(``"benchmark"``, ``"evaluation"``); the comparisons across versions are
``registry.domain.version_metrics``'.
"""

from __future__ import annotations

from registry.domain import version_metrics
from registry.domain.choices import JobKind, JobStatus
from registry.models import Job, ModelVersion, RegisteredModel

MEASURED_KEYS = ("benchmark", "evaluation")
SAME_SPEED_PCT = 0.5  # closer than this to the stable's samples/s reads "about the same"
MEASURING_KINDS = (JobKind.BENCHMARK, JobKind.EVALUATION)


# ---------------------------------------------------------------- versions table


def headline(metrics: dict | None) -> dict:
    """samples/s at the largest batch size measured, p99 at batch 1, accuracy (or MAE)
    per data set, and the other recorded metrics as they are."""
    metrics = _mapping(metrics)
    sizes = benchmark_sizes(metrics.get("benchmark"))
    largest = sizes[-1] if sizes else None
    scores = [score(name, _mapping(result)) for name, result in sorted(_mapping(metrics.get("evaluation")).items())]
    other = {key: value for key, value in metrics.items() if key not in MEASURED_KEYS}
    p99_at_1 = next((size.get("p99_ms") for size in sizes if size.get("batch_size") == 1), None)
    return {
        "throughput": {"batch_size": largest["batch_size"], "samples_per_s": largest.get("samples_per_s")} if largest else None,
        "p99_ms_at_1": p99_at_1, "scores": scores, "other": other,
        "empty": not (largest or scores or other),
    }


def benchmark_sizes(benchmark: dict | None) -> list[dict]:
    sizes = [size for size in _mapping(benchmark).get("sizes") or [] if isinstance(size, dict) and isinstance(size.get("batch_size"), int)]
    return sorted(sizes, key=lambda size: size["batch_size"])


def _mapping(value) -> dict:
    """Metrics recorded at upload are free-form: a key that is not a job's result shape reads as absent."""
    return value if isinstance(value, dict) else {}


def score(dataset: str, result: dict) -> dict:
    """A data set's one number: accuracy for a classifier, MAE for a regressor."""
    if result.get("accuracy") is not None:
        return {"dataset": dataset, "label": "accuracy", "text": f"{result['accuracy']:.2%}"}
    return {"dataset": dataset, "label": "MAE", "text": _number(result.get("mae"))}


def _number(value) -> str:
    return "—" if value is None else f"{value:.4g}"


def measuring(model: RegisteredModel) -> dict[int, list[str]]:
    """Per version number, the kinds of measurement queued or running (benchmark, evaluation)."""
    active = (Job.objects.filter(model=model, kind__in=MEASURING_KINDS, status__in=(JobStatus.QUEUED, JobStatus.RUNNING), version__isnull=False)
              .values_list("version__number", "kind").distinct())
    kinds: dict[int, list[str]] = {}
    for number, kind in active:
        kinds.setdefault(number, []).append(kind)
    return {number: sorted(names) for number, names in kinds.items()}


def evaluation_context(model: RegisteredModel) -> dict:
    """The versions × data sets table; asked only when the model has a data set."""
    if not model.datasets.exists():
        return {"datasets": [], "rows": []}
    return version_metrics.evaluation_table(model)


# ---------------------------------------------------------------- version page


def version_metrics_context(version: ModelVersion, stable_number: int | None) -> dict:
    metrics = _mapping(version.metrics)
    stable = None
    if stable_number is not None and stable_number != version.number:
        stable = version.model.versions.filter(number=stable_number).first()
    return {
        "benchmark": _mapping(metrics.get("benchmark")) or None,
        "benchmark_rows": benchmark_rows(version, stable),
        "compared_with": stable if stable is not None and _mapping(_mapping(stable.metrics).get("benchmark")) else None,
        "evaluations": evaluation_details(metrics.get("evaluation")),
        "dataset_names": list(version.model.datasets.order_by("name").values_list("name", flat=True)),
        "other_metrics": {key: value for key, value in metrics.items() if key not in MEASURED_KEYS},
    }


def benchmark_rows(version: ModelVersion, stable: ModelVersion | None) -> list[dict]:
    """The version's own figures per batch size, each with the stable's beside it when
    the stable was measured at that size."""
    own = benchmark_sizes(_mapping(version.metrics).get("benchmark"))
    compared = {}
    if own and stable is not None and _mapping(_mapping(stable.metrics).get("benchmark")):
        compared = {row["batch_size"]: row for row in version_metrics.benchmark_comparison(version, stable)}
    return [{**size, **_against(compared.get(size.get("batch_size")))} for size in own]


def _against(row: dict | None) -> dict:
    if row is None:
        return {"compared": False}
    words, trend = change_words(row.get("samples_per_s"), row.get("stable_samples_per_s"), row.get("change_pct"))
    return {"compared": True, "stable_samples_per_s": row.get("stable_samples_per_s"), "stable_p99_ms": row.get("stable_p99_ms"),
            "change": words, "trend": trend}


def change_words(samples_per_s, stable_samples_per_s, change_pct) -> tuple[str, str]:
    """'12.3% faster' / '4.0% slower' / 'about the same', and its trend for the colour.
    The word comes from the two rates themselves, never from the sign alone."""
    if samples_per_s is None or not stable_samples_per_s:
        return "not comparable", "unknown"
    if change_pct is None:
        change_pct = (samples_per_s / stable_samples_per_s - 1) * 100
    if abs(change_pct) < SAME_SPEED_PCT:
        return "about the same", "same"
    faster = samples_per_s > stable_samples_per_s
    return f"{abs(change_pct):.1f}% {'faster' if faster else 'slower'}", "faster" if faster else "slower"


def evaluation_details(evaluation: dict | None) -> list[dict]:
    """Each data set's result, with its per-class figures and confusion matrix in rows."""
    return [_details(name, _mapping(result)) for name, result in sorted(_mapping(evaluation).items())]


# What a page shows of an evaluation, as serving/jobs/evaluate.py keeps it since 7 Dec; an
# older result kept a matrix of any size (540 classes: a page of 294,338 cells).
SHOWN_MATRIX_CLASSES = 64
SHOWN_PER_CLASS = 256


def _most_supported(classes: list[str], per_class: dict) -> list[str]:
    """The SHOWN_PER_CLASS classes with the most rows, in class order."""
    if len(classes) <= SHOWN_PER_CLASS:
        return classes

    def support(label: str) -> int:
        value = _mapping(per_class.get(label)).get("support")
        return value if isinstance(value, int) else 0

    kept = set(sorted(classes, key=support, reverse=True)[:SHOWN_PER_CLASS])
    return [label for label in classes if label in kept]


def _details(name: str, result: dict) -> dict:
    classes = [str(label) for label in result.get("classes") or []]
    per_class = _mapping(result.get("per_class"))
    matrix = result.get("confusion_matrix") or [] if len(classes) <= SHOWN_MATRIX_CLASSES else []
    shown = _most_supported(classes, per_class)
    count = result.get("classes_count") if isinstance(result.get("classes_count"), int) else len(classes)
    return {
        "name": name, "result": result, "classes": classes if matrix else [],
        "per_class": [{"label": label, **_mapping(per_class.get(label))} for label in shown],
        "matrix": [{"label": label, "cells": cells} for label, cells in zip(classes, matrix, strict=False)],
        "classes_count": count, "classes_cut": count > len(shown) or (bool(classes) and not matrix),
        "matrix_max": SHOWN_MATRIX_CLASSES,
    }
