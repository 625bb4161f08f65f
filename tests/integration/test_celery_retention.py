"""Retention runs as a Celery task in a real Celery worker process."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from django.db import connection

from registry.actions import uploads
from registry.building.onnx_build import random_mlp, to_bytes
from registry.models import RegisteredModel
from registry.tasks import apply_retention
from tools.stack import REPO_ROOT, make_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def celery_worker(tmp_path, settings):
    # This process sends the task: the worker listens under this process's broker prefix.
    stack = make_stack(tmp_path, settings, connection.settings_dict, RETENTION_KEEP_VERSIONS="1", CHANNEL_LAYER_PREFIX=settings.CHANNEL_LAYER_PREFIX)
    log = open(tmp_path / "celery.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool", "solo", "--loglevel", "INFO", "--without-mingle", "--without-gossip"],
        cwd=REPO_ROOT, env=stack.env, stdout=log, stderr=subprocess.STDOUT,
    )
    yield process
    process.terminate()
    process.wait(timeout=20)
    print((tmp_path / "celery.log").read_text(errors="replace")[-3000:])


def test_retention_task_archives_old_versions_in_a_real_worker(celery_worker):
    model = RegisteredModel.objects.create(name="digits")
    for seed in range(3):
        uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([8, 4], seed=seed))), uploaded_by=None)

    apply_retention.delay()

    archived = wait_until(lambda: list(model.versions.filter(status="archived").values_list("number", flat=True)), 30, 0.2)
    assert archived == [2]  # v1 is routed, v3 is the newest
