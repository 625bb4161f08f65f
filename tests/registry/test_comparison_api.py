"""GET /api/models/{name}/comparison/: versions side by side, as the console's tables show
them, for scripts (a CI gate on "v7 is no slower and no less accurate than stable")."""

from __future__ import annotations

import pytest

from registry.domain.choices import DatasetTask
from registry.models import EvaluationDataset

pytestmark = pytest.mark.django_db
COMPARISON = "/api/models/digits/comparison/"


def benchmark(samples_per_s: float, p99_ms: float) -> dict:
    return {"sizes": [{"batch_size": 8, "runs": 20, "samples_per_s": samples_per_s, "p50_ms": p99_ms / 2, "p99_ms": p99_ms}]}


def measure(model, number: int, **metrics) -> None:
    version = model.versions.get(number=number)
    version.metrics = metrics
    version.save()


def test_each_ready_version_is_compared_with_the_stable_ones_throughput(jobs_model, viewer_client):
    measure(jobs_model, 1, benchmark=benchmark(1000.0, 4.0))
    measure(jobs_model, 2, benchmark=benchmark(1250.0, 3.0))

    body = viewer_client.get(COMPARISON).json()

    assert body["stable_version"] == 1
    by_version = {entry["version"]: entry["sizes"] for entry in body["benchmarks"]}
    assert set(by_version) == {1, 2}  # version 3 is still being validated
    assert by_version[2] == [{"batch_size": 8, "samples_per_s": 1250.0, "stable_samples_per_s": 1000.0, "change_pct": 25.0,
                              "p99_ms": 3.0, "stable_p99_ms": 4.0}]


def test_a_version_without_a_benchmark_has_no_comparison(jobs_model, viewer_client):
    measure(jobs_model, 1, benchmark=benchmark(1000.0, 4.0))

    body = viewer_client.get(COMPARISON).json()

    assert {entry["version"]: entry["sizes"] for entry in body["benchmarks"]}[2] == []


def test_every_version_is_scored_on_every_data_set(jobs_model, viewer_client):
    dataset = EvaluationDataset.objects.create(model=jobs_model, name="holdout", task=DatasetTask.CLASSIFICATION, file_format="npz",
                                               sha256="d" * 64, size_bytes=10, rows=10)
    measure(jobs_model, 2, evaluation={"holdout": {"accuracy": 0.9, "dataset_sha256": dataset.sha256}})

    body = viewer_client.get(COMPARISON).json()

    assert body["evaluation"]["datasets"] == [{"name": "holdout", "task": "classification", "rows": 10}]
    cells = {row["version"]: row["cells"] for row in body["evaluation"]["rows"]}
    assert cells[2] == {"holdout": {"accuracy": 0.9}}


def test_an_unknown_model_has_no_comparison(db, viewer_client):
    assert viewer_client.get("/api/models/nope/comparison/").status_code == 404


def test_a_stranger_may_not_read_the_comparison(jobs_model, stranger_client):
    assert stranger_client.get(COMPARISON).status_code == 401
