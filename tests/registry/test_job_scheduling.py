"""Which jobs follow a ready version or a new data set, and what the benchmark and
evaluation handlers keep in the version's metrics.

Tests marked ``child`` run the job for real (``python -m serving.jobs``)."""

from __future__ import annotations

import fcntl
import io
import threading

import numpy as np
import pytest

from registry.actions import datasets
from registry.artifacts import storage
from registry.building.onnx_build import random_mlp, to_bytes
from registry.domain.choices import JobKind, JobStatus, VersionStatus
from registry.jobs import benchmark, records, runner, scheduling
from registry.jobs.runner import JobCancelled
from registry.jobs.versions import store_metric
from registry.models import Job, ModelVersion
from tests.fixtures.job_world import CLASSES, SIGNATURE, npz_upload, rows, stored_version

pytestmark = pytest.mark.django_db


def add_dataset(model, name="holdout", operator=None):
    upload = npz_upload(f"{name}.npz", input=rows(4), labels=np.array([0, 1, 2, 3]))
    return datasets.add(model, upload, name=name, task="classification", created_by=operator)


def kinds_and_keys(jobs) -> list[tuple[str, str]]:
    return [(job.kind, job.key) for job in jobs]


def test_a_ready_version_is_benchmarked_and_evaluated_on_every_data_set(jobs_model):
    first, second = add_dataset(jobs_model, "a"), add_dataset(jobs_model, "b")
    version = stored_version(jobs_model, 4)

    jobs = scheduling.version_ready(version)

    assert kinds_and_keys(jobs) == [("benchmark", f"benchmark:{version.pk}"), ("evaluation", f"evaluation:{version.pk}:{first.pk}"),
                                    ("evaluation", f"evaluation:{version.pk}:{second.pk}")]
    assert all(job.status == JobStatus.QUEUED and job.version_id == version.pk for job in jobs)


def test_a_version_made_ready_twice_gets_its_jobs_once(jobs_model):
    add_dataset(jobs_model)
    version = stored_version(jobs_model, 4)

    first = scheduling.version_ready(version)
    again = scheduling.version_ready(version)

    assert [job.pk for job in again] == [job.pk for job in first]
    assert Job.objects.filter(version=version).count() == 2


def test_benchmarks_can_be_switched_off(jobs_model, settings):
    settings.BENCHMARK_ENABLED = False

    assert scheduling.version_ready(stored_version(jobs_model, 4)) == []


def test_a_new_data_set_is_evaluated_on_every_ready_version_only(jobs_model):
    stored_version(jobs_model, 4, status=VersionStatus.ARCHIVED)

    dataset = add_dataset(jobs_model)

    assert sorted(Job.objects.filter(dataset=dataset).values_list("version__number", flat=True)) == [1, 2]


def test_a_data_set_past_its_limit_is_refused_before_it_is_copied(jobs_model, settings, artifact_root):
    settings.DATASET_MAX_BYTES = 100

    with pytest.raises(datasets.DatasetRefused) as refused:
        add_dataset(jobs_model)

    assert (refused.value.status, refused.value.reason) == (413, "the data set is larger than the limit of 100 bytes (DATASET_MAX_BYTES)")
    assert not (artifact_root / "datasets").exists() and list((artifact_root / "tmp").iterdir()) == []


def test_a_version_whose_artifact_is_missing_fails_its_job_saying_so(jobs_model):
    version = stored_version(jobs_model, 4, status=VersionStatus.REJECTED, seed=99)
    storage.path_for(version.sha256).unlink()  # lost from the store
    job = records.create(JobKind.BENCHMARK, jobs_model, version=version)

    assert runner.run(job.pk) == JobStatus.FAILED
    assert Job.objects.get(pk=job.pk).error == "the artifact of version 4 is not in the store (the version is rejected)"


def test_metrics_written_by_two_jobs_keep_each_others_keys(jobs_model):
    version = jobs_model.versions.get(number=1)
    version.metrics = {"accuracy": 0.9}
    version.save()
    stale = jobs_model.versions.get(number=1)  # read before the others wrote

    store_metric(version, "evaluation", {"accuracy": 0.5}, entry="a")
    store_metric(stale, "evaluation", {"accuracy": 0.7}, entry="b")
    store_metric(stale, "benchmark", {"sizes": []})

    version.refresh_from_db()
    assert version.metrics == {"accuracy": 0.9, "evaluation": {"a": {"accuracy": 0.5}, "b": {"accuracy": 0.7}}, "benchmark": {"sizes": []}}


def test_a_benchmark_waiting_for_the_slot_stops_when_cancelled(jobs_model, tmp_path):
    job = records.create(JobKind.BENCHMARK, jobs_model, version=jobs_model.versions.get(number=1))
    lock = tmp_path / "benchmark.lock"
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    with open(lock, "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(JobCancelled), benchmark.exclusive_slot(job, lock):
            pytest.fail("the slot was held by another benchmark")


def test_a_benchmark_gets_the_slot_once_the_other_lets_go(jobs_model, tmp_path):
    job = records.create(JobKind.BENCHMARK, jobs_model, version=jobs_model.versions.get(number=1))
    lock = tmp_path / "benchmark.lock"
    held = open(lock, "ab")  # noqa: SIM115 (the timer closes it: the other benchmark lets go)
    fcntl.flock(held, fcntl.LOCK_EX)
    threading.Timer(0.3, held.close).start()

    with benchmark.exclusive_slot(job, lock), open(lock, "ab") as other, pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_job_on_an_archived_version_fails_saying_so(jobs_model):
    version = jobs_model.versions.get(number=2)
    job = records.create(JobKind.BENCHMARK, jobs_model, version=version, key="benchmark:x")
    version.status = VersionStatus.ARCHIVED
    version.save()

    assert runner.run(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert job.error == "the artifact of version 2 was deleted by retention"


@pytest.mark.child
def test_a_benchmark_keeps_its_measurements_in_the_version(jobs_model, settings):
    settings.SERVING_DEFAULT_MAX_BATCH_SIZE = 16
    version = jobs_model.versions.get(number=1)
    job = scheduling.version_ready(version)[0]

    assert runner.run(job.pk) == JobStatus.SUCCEEDED

    version.refresh_from_db()
    kept = version.metrics["benchmark"]
    assert [size["batch_size"] for size in kept["sizes"]] == [1, 8, 16]
    assert all(size["samples_per_s"] > 0 and size["p99_ms"] >= size["p50_ms"] > 0 for size in kept["sizes"])
    assert kept["job"] == job.pk and kept["measured_at"] and kept["device"] == "cpu"


@pytest.mark.child
def test_an_evaluation_of_a_version_the_data_set_does_not_fit_fails_with_the_reason(jobs_model):
    # An upload is checked against the stable version only; another ready version may take other inputs.
    staged = storage.stage_stream(io.BytesIO(to_bytes(random_mlp([5, CLASSES], seed=9))))
    storage.commit(staged)
    narrow = ModelVersion.objects.create(model=jobs_model, number=4, status=VersionStatus.READY, sha256=staged.sha256,
                                         size_bytes=staged.size_bytes, opset=17, producer="tests",
                                         signature={**SIGNATURE, "inputs": [{"name": "input", "datatype": "FP32", "shape": ["batch", 5]}]})
    dataset = add_dataset(jobs_model)
    job = Job.objects.get(dataset=dataset, version=narrow)

    assert runner.run(job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert "input 'input' expects rows of shape [5]" in job.error
    assert "evaluation" not in job.version.metrics
