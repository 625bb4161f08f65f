"""Which jobs follow from what happened: a version became ready, a data set arrived.

A ready version is benchmarked (unless ``BENCHMARK_ENABLED`` is false) and evaluated on
every data set of its model; a new data set is evaluated on every ready version. Each of
these jobs has a key (``benchmark:<version pk>``, ``evaluation:<version pk>:<data set
pk>``), so calling these twice queues nothing new.
"""

from __future__ import annotations

from django.conf import settings

from registry.domain.choices import JobKind
from registry.jobs import records
from registry.models import EvaluationDataset, Job, ModelVersion


def version_ready(version: ModelVersion) -> list[Job]:
    """Queue the jobs a newly ready version gets; returns them."""
    jobs = []
    if settings.BENCHMARK_ENABLED:
        jobs.append(records.create(JobKind.BENCHMARK, version.model, version=version, key=f"benchmark:{version.pk}"))
    for dataset in version.model.datasets.order_by("pk"):
        jobs.append(evaluate(version, dataset))
    return jobs


def dataset_added(dataset: EvaluationDataset) -> list[Job]:
    """Queue an evaluation of every ready version of the data set's model on it."""
    return [evaluate(version, dataset) for version in dataset.model.versions.ready().order_by("number")]


def evaluate(version: ModelVersion, dataset: EvaluationDataset) -> Job:
    return records.create(JobKind.EVALUATION, version.model, version=version, dataset=dataset,
                          key=f"evaluation:{version.pk}:{dataset.pk}")
