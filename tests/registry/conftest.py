from __future__ import annotations

import io
import threading
import time

import pytest
from django.db import connection
from rest_framework.test import APIClient

from registry.actions import uploads
from registry.artifacts.inspection import inspect_artifact
from registry.building.onnx_build import random_mlp, to_bytes
from registry.models import ModelVersion, RegisteredModel, Release

_REPORTS: dict[str, object] = {}


def _remembered_inspection(artifact, *, sha256, **limits):
    """The real child-process inspection, run once per distinct artifact per session:
    the same bytes always give the same report, and this keeps the suite quick."""
    if sha256 not in _REPORTS:
        _REPORTS[sha256] = inspect_artifact(artifact, sha256=sha256, **limits)
    return _REPORTS[sha256]


def _burn_row_ids(count: int = 5) -> None:
    """Create and delete rows so later versions and releases get ids unlike their numbers
    and generations (ids are never reused): on a fresh SQLite database id 1 would be
    version 1, hiding any code that looks a version up by the other."""
    decoy = RegisteredModel.objects.create(name="decoy-for-row-ids")
    for index in range(count):
        version = ModelVersion.objects.create(model=decoy, number=index + 1, sha256=f"{index:064x}", size_bytes=1)
        Release.objects.create(model=decoy, generation=10**9 + index, routes=[], stable_version=version.number, action="initial")
    decoy.delete()


@pytest.fixture
def three_versions(db, operator, monkeypatch) -> RegisteredModel:
    """Model ``digits`` with versions 1..3; version 1 is stable at 100%. Row ids differ
    from version numbers and generations."""
    monkeypatch.setattr(uploads, "inspect_artifact", _remembered_inspection)
    _burn_row_ids()
    model = RegisteredModel.objects.create(name="digits")
    for seed in range(3):
        uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([8, 4], seed=seed))), uploaded_by=operator)
    return model


@pytest.fixture
def worker_client(settings) -> APIClient:
    """An API client holding the worker token, as a serving worker calls the console."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {settings.SERVING_WORKER_TOKEN}")
    return client


def in_thread(steps) -> threading.Thread:
    """``steps`` started on a thread of their own (a worker speaking the worker API while a
    drill waits), its database connection closed after."""

    def run():
        try:
            steps()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def wait_for_generation(generation: int, timeout_s: float = 10) -> None:
    """Until the release of ``generation`` exists (a worker's thread waiting for a drill's click)."""
    deadline = time.monotonic() + timeout_s
    while not Release.objects.filter(generation=generation).exists():
        assert time.monotonic() < deadline, f"generation {generation} never came"
        time.sleep(0.01)
