"""Concurrent uploads and traffic changes, each on its own database connection."""

from __future__ import annotations

import io

import pytest

from registry.actions import releases, uploads
from registry.building.onnx_build import random_mlp, to_bytes
from registry.models import RegisteredModel, Release
from tests.fixtures.threads import run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_uploads_get_distinct_numbers(settings):
    settings.INSPECTION_MAX_CONCURRENT = 4  # all four inspect at once; the limit has its own tests
    model = RegisteredModel.objects.create(name="digits")
    artifacts = [to_bytes(random_mlp([8, 4], seed=seed)) for seed in range(4)]

    versions = run_in_threads(4, lambda index: uploads.register_stream(model, io.BytesIO(artifacts[index]), uploaded_by=None))

    assert all(not isinstance(version, Exception) for version in versions), versions
    assert sorted(version.number for version in versions) == [1, 2, 3, 4]
    assert Release.objects.filter(model=model).count() == 1


def test_concurrent_traffic_changes_leave_a_gap_free_history(operator):
    model = RegisteredModel.objects.create(name="digits")
    for seed in range(3):
        uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([8, 4], seed=seed))), uploaded_by=None)
    actor = operator

    def change(index: int):
        if index % 2:
            return releases.rollback(model, actor)
        return releases.set_routes(model, [{"version": 1, "weight": 90}, {"version": 2 + index % 4 // 2, "weight": 10}], actor)

    results = run_in_threads(8, change)

    generations = list(Release.objects.order_by("generation").values_list("generation", flat=True))
    assert generations == list(range(1, len(generations) + 1))
    made = [result for result in results if isinstance(result, Release)]
    refused = [result for result in results if isinstance(result, releases.ReleaseError)]
    assert len(made) + len(refused) == 8, results  # no other failure (a lock error, a deadlock)
    assert len(generations) == 1 + len(made)
    assert set(Release.objects.filter(generation__gt=1).values_list("actor__username", flat=True)) == {"olivia"}
