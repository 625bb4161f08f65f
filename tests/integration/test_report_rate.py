"""A worker held to a slower report rate by the console (WORKER_REPORTS_PER_S) waits as
it is told (Retry-After) and loses none of its figures: a refused report's deltas go
with the next one."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from django.db import connection
from django.db.models import Sum

from registry.models import VersionMetricMinute
from tools.stack import running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROW = [0.5] * 16
REQUESTS = 60


@pytest.fixture
def stack(tmp_path, settings, model):
    # Five reports a second asked for, one allowed: most would be refused, were the worker not to wait.
    with running_stack(tmp_path, settings, connection.settings_dict, WORKER_REPORTS_PER_S="1", WORKER_REPORT_BURST="1",
                       SERVING_REPORT_INTERVAL_S="0.2") as stack:
        yield stack


def recorded_requests(model) -> int:
    return VersionMetricMinute.objects.filter(version__model=model).aggregate(total=Sum("requests"))["total"] or 0


def test_a_worker_told_to_report_less_often_loses_no_request_from_its_figures(stack, model):
    worker = stack.start_worker()
    with httpx.Client(base_url=worker.url, timeout=10) as client:
        for _ in range(REQUESTS):
            assert client.post("/predict", json={"model_name": "tiny", "inputs": [ROW]}).status_code == 200
            time.sleep(0.05)

    counted = wait_until(lambda: recorded_requests(model) >= REQUESTS, 10, 0.1)
    time.sleep(1.5)  # a report after the total was reached would show a count too many

    assert counted and recorded_requests(model) == REQUESTS
    refusals = [line for line in worker.log().splitlines() if "report_refused" in line]
    assert refusals and "429" in refusals[0], refusals  # the console did hold it back


def test_a_worker_refused_as_too_soon_waits_the_retry_after_before_reporting_again(stack, model):
    worker = stack.start_worker()
    time.sleep(4)

    # Each streak of refusals ends in one "reports_accepted_again" line with its length:
    # a worker that waits as told is refused once per streak, not at every 0.2 s interval.
    streaks = [json.loads(line)["refused"] for line in worker.log().splitlines() if "reports_accepted_again" in line]
    assert streaks and set(streaks) == {1}, streaks
