"""kill -9 of one of two workers under load: the survivor loses nothing, and the console
stops listing the killed one within WORKER_GONE_AFTER_S plus one report interval."""

from __future__ import annotations

import collections
import threading
import time

import httpx
import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from tools.stack import running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROW = [0.5] * 16
SLACK_S = 1.0  # the test's own polling and a loaded machine's scheduling


@pytest.fixture
def stack(tmp_path, settings, model):
    with running_stack(tmp_path, settings, connection.settings_dict) as stack:
        yield stack


def listed_workers(api: httpx.Client) -> set[str]:
    return {row["worker_id"] for row in api.get("/api/workers/").json()}


def test_a_killed_worker_is_marked_gone_in_time_and_the_survivor_loses_no_request(stack, operator):
    survivor, doomed = stack.start_worker(), stack.start_worker()
    gone_after_s, report_interval_s = float(stack.env["WORKER_GONE_AFTER_S"]), float(stack.env["SERVING_REPORT_INTERVAL_S"])
    token, _ = Token.objects.get_or_create(user=operator)
    api = httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Token {token.key}"}, timeout=10)
    assert wait_until(lambda: listed_workers(api) == {"worker-0", "worker-1"}, 10)
    stop, statuses = threading.Event(), collections.Counter()

    def load() -> None:
        with httpx.Client(base_url=survivor.url, timeout=10) as client:
            while not stop.is_set():
                try:
                    statuses[client.post("/predict", json={"model_name": "tiny", "inputs": [ROW]}).status_code] += 1
                except httpx.HTTPError as error:
                    statuses[type(error).__name__] += 1

    loader = threading.Thread(target=load)
    loader.start()
    try:
        time.sleep(0.5)
        doomed.kill()
        killed_at = time.monotonic()
        gone = wait_until(lambda: listed_workers(api) == {"worker-0"}, gone_after_s + report_interval_s + 10, 0.05)
        detected_s = time.monotonic() - killed_at
        time.sleep(0.5)  # the survivor keeps answering after the console noticed
    finally:
        stop.set()
        loader.join(15)
        api.close()

    print(f"killed worker unlisted after {detected_s:.2f} s (WORKER_GONE_AFTER_S={gone_after_s:g}, report interval {report_interval_s:g} s); "
          f"survivor answered {dict(statuses)}")
    assert doomed.popen.returncode == -9
    assert gone
    assert detected_s <= gone_after_s + report_interval_s + SLACK_S
    assert set(statuses) == {200} and statuses[200] > 100, statuses
