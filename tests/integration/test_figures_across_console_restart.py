"""The requests a worker answers while its console is down are in the console's figures
once it is back: the reports that could not be sent go with the first one that is."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import httpx
import pytest
from django.db import connection
from django.db.models import Sum

from registry.models import VersionMetricMinute
from tools.stack import running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROW = [0.5] * 16


@pytest.fixture
def stack(tmp_path, settings, model):
    with running_stack(tmp_path, settings, connection.settings_dict) as stack:
        yield stack


def recorded_requests(model) -> int:
    return VersionMetricMinute.objects.filter(version__model=model).aggregate(total=Sum("requests"))["total"] or 0


def predict(client: httpx.Client, times: int) -> None:
    for _ in range(times):
        assert client.post("/predict", json={"model_name": "tiny", "inputs": [ROW]}).status_code == 200


def test_requests_answered_while_the_console_was_down_are_counted_once_it_is_back(stack, model):
    worker = stack.start_worker()
    port, report_interval_s = urlsplit(stack.console.url).port, float(stack.env["SERVING_REPORT_INTERVAL_S"])
    with httpx.Client(base_url=worker.url, timeout=10) as client:
        predict(client, 10)
        assert wait_until(lambda: recorded_requests(model) == 10, 10, 0.1)
        stack.console.kill()
        predict(client, 30)
        time.sleep(4 * report_interval_s)  # reports that find no console
        stack.start_console(port=port)

    counted = wait_until(lambda: recorded_requests(model) >= 40, 30, 0.1)  # generous: a loaded machine's reconnect
    time.sleep(3 * report_interval_s)  # a report after the total was reached would show a count too many

    assert counted and recorded_requests(model) == 40  # 10 before: the 30 answered while it was down were lost
