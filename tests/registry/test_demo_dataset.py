"""``make_demo_models`` adds the digits held-out split as data set ``digits-test``, once,
so the demo's versions get evaluation numbers as soon as Celery runs their jobs.

The test marked ``child`` runs the evaluations for real (``python -m serving.jobs``)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from django.core.management import call_command

from registry.building.demo import demo_test_split
from registry.domain.choices import JobKind, JobStatus
from registry.jobs import files, runner
from registry.models import EvaluationDataset, Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(db):
    output = io.StringIO()
    call_command("make_demo_models", stdout=output)
    return output.getvalue()


def test_the_demo_adds_its_test_split_as_a_data_set(demo):
    dataset = EvaluationDataset.objects.get(model__name="digits", name="digits-test")
    pixels, labels = demo_test_split()

    assert (dataset.task, dataset.file_format, dataset.rows) == ("classification", "npz", len(labels))
    with np.load(files.dataset_path(dataset)) as stored:
        assert sorted(stored.files) == ["input", "labels"]
        assert np.array_equal(stored["input"], pixels.astype(np.float32)) and np.array_equal(stored["labels"], labels)
    assert sorted(Job.objects.filter(kind=JobKind.EVALUATION, dataset=dataset).values_list("version__number", flat=True)) == [1, 2]


def test_running_the_demo_again_adds_it_once(demo):
    again = io.StringIO()
    call_command("make_demo_models", stdout=again)

    assert EvaluationDataset.objects.filter(name="digits-test").count() == 1
    assert "digits data set digits-test: already added" in again.getvalue()


@pytest.mark.child
def test_the_demo_evaluations_give_the_accuracy_measured_at_training(demo):
    for job in Job.objects.filter(kind=JobKind.EVALUATION):
        assert runner.run(job.pk) == JobStatus.SUCCEEDED

    for version in EvaluationDataset.objects.get(name="digits-test").model.versions.all():
        assert round(version.metrics["evaluation"]["digits-test"]["accuracy"], 4) == version.metrics["accuracy"]
