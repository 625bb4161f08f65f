"""A Redis that takes connections and never answers (a stopped process: the kernel still
completes the handshake) holds no console request past its bound: the news a request sends
on the channel layer or to Celery has another way to arrive, and the request is answered."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from console import redis_options
from serving.contract import CONTRACT_VERSION

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
SLACK_S = 3.0  # the test's own overhead on a loaded 2-core machine


@pytest.fixture
def frozen_redis_url():
    with socket.create_server(("127.0.0.1", 0), backlog=64) as server:  # listens, never accepts
        yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"


@pytest.fixture
def frozen_channel_layer(settings, frozen_redis_url):
    settings.CHANNEL_LAYERS = redis_options.channel_layers(frozen_redis_url, "frozen-test")


def report() -> dict:
    return {"worker": {"id": "w-1", "host": "box", "pid": 7, "url": "http://127.0.0.1:9", "device": "cpu"}, "generation": 1,
            "loaded": [], "versions": [{"model": "digits", "version": 1, "requests": 5, "errors": 0, "latency_sum_s": 0.01,
                                        "latency_buckets": {"+Inf": 5}, "batch_size_buckets": {"1": 5, "+Inf": 5}}],
            "contract": CONTRACT_VERSION}


def test_a_worker_report_is_answered_and_stored_while_redis_never_answers(worker_client, three_versions, frozen_channel_layer):
    started = time.monotonic()
    response = worker_client.post("/api/serving/reports", report(), format="json")

    assert response.status_code == 204
    assert time.monotonic() - started < django_settings.CHANNEL_SEND_TIMEOUT_S + SLACK_S
    assert three_versions.versions.get(number=1).metric_minutes.get().requests == 5


def test_a_traffic_change_is_answered_while_redis_never_answers_its_push(operator_client, three_versions, frozen_channel_layer,
                                                                          django_capture_on_commit_callbacks):
    started = time.monotonic()
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_client.post("/api/models/digits/release/", {"routes": [{"version": 2, "weight": 100}]}, format="json")

    assert response.status_code == 201, response.content
    assert time.monotonic() - started < django_settings.CHANNEL_SEND_TIMEOUT_S + SLACK_S


def test_a_job_sent_to_a_celery_broker_that_never_answers_gives_up_within_the_read_timeout(frozen_redis_url, tmp_path):
    """The console's own settings and Celery app, in a process of their own (the broker is
    chosen at start): the send fails, and the job is left for the sweep to send again."""
    code = textwrap.dedent("""
        import time, django
        django.setup()
        import console.celery
        from registry import tasks
        started = time.monotonic()
        try:
            tasks.run_job.delay(1)
        except Exception as error:
            print("refused", type(error).__name__, round(time.monotonic() - started, 1))
    """)
    env = {**os.environ, "REDIS_URL": frozen_redis_url, "DJANGO_SETTINGS_MODULE": "console.settings", "DATA_DIR": str(tmp_path),
           "PYTHONPATH": str(ROOT)}
    env.pop("DATABASE_URL", None)
    limit_s = redis_options.READ_TIMEOUT_S * 2 + redis_options.CONNECT_TIMEOUT_S + 10  # one retry, Django's start-up

    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=limit_s)

    assert done.stdout.startswith("refused "), done.stdout + done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) <= redis_options.READ_TIMEOUT_S * 2 + redis_options.CONNECT_TIMEOUT_S
