"""A ready version whose file is not in the store is the store's fault, not retention's:
its download is a 503 with Retry-After that names where the console looked (workers
retry, and the file comes back when the volume does), logged once as an ERROR. Only an
archived version's download says "deleted by retention" (tests/registry/test_retention.py).

The store goes missing as in the fault run: the console started again on another
ARTIFACT_ROOT, the database the same.
"""

from __future__ import annotations

import logging

import pytest

from registry.artifacts import storage
from registry.models import ModelVersion

pytestmark = pytest.mark.django_db
ARTIFACT = "/api/models/digits/versions/1/artifact"


@pytest.fixture
def wrong_store(three_versions, settings, tmp_path):
    """The console's ARTIFACT_ROOT now names an empty folder; returns the right one."""
    right = settings.ARTIFACT_ROOT
    settings.ARTIFACT_ROOT = tmp_path / "not-mounted"
    return right


def test_a_ready_version_whose_file_is_missing_is_503_naming_where_the_console_looked(wrong_store, worker_client, settings):
    version = ModelVersion.objects.get(model__name="digits", number=1)

    response = worker_client.get(ARTIFACT)

    assert response.status_code == 503
    assert response["Retry-After"] == "30"
    assert response.json() == {"error": f"the artifact of digits v1 is missing from the artifact store: no file at sha256/"
                                        f"{version.sha256[:2]}/{version.sha256} under ARTIFACT_ROOT (the console's log names the "
                                        "whole path); is the store's volume mounted? retry in 30 s"}
    assert ModelVersion.objects.get(pk=version.pk).status == "ready"


def test_the_file_is_served_again_once_the_store_is_back(wrong_store, worker_client, settings):
    assert worker_client.get(ARTIFACT).status_code == 503
    settings.ARTIFACT_ROOT = wrong_store  # the volume is mounted again

    response = worker_client.get(ARTIFACT)

    version = ModelVersion.objects.get(model__name="digits", number=1)
    assert response.status_code == 200
    assert response["X-Artifact-SHA256"] == version.sha256
    assert b"".join(response.streaming_content) == storage.path_for(version.sha256).read_bytes()


def test_a_missing_file_is_logged_once_as_an_error_however_often_workers_retry(wrong_store, worker_client, settings, caplog):
    version = ModelVersion.objects.get(model__name="digits", number=1)

    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            assert worker_client.get(ARTIFACT).status_code == 503

    # Beside Django's own line for any 5xx ("Service Unavailable: <path>"), which names no cause.
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR and record.name.startswith("registry")]
    looked_at = storage.path_for(version.sha256)
    assert errors == [f"digits v1 is ready but its file is missing: no file at {looked_at} (ARTIFACT_ROOT {settings.ARTIFACT_ROOT})"]
