"""SIGTERM to a worker of a real stack: its last report says it stopped, and the console
lists it as stopped at once, long before WORKER_GONE_AFTER_S would call it gone."""

from __future__ import annotations

import signal

import httpx
import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from tools.stack import running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(tmp_path, settings, model):
    with running_stack(tmp_path, settings, connection.settings_dict, WORKER_GONE_AFTER_S="30") as stack:
        yield stack


def lifecycles(api: httpx.Client, **params) -> dict[str, str]:
    return {row["worker_id"]: row["lifecycle"] for row in api.get("/api/workers/", params=params).json()}


def test_a_worker_stopped_by_sigterm_is_shown_stopped_at_once_not_gone(stack, operator):
    worker = stack.start_worker(SERVING_DRAIN_DELAY_S="0.5", SERVING_DRAIN_TIMEOUT_S="2")
    token, _ = Token.objects.get_or_create(user=operator)
    with httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Token {token.key}"}, timeout=10) as api:
        assert wait_until(lambda: lifecycles(api) == {"worker-0": "serving"}, 10)
        worker.popen.send_signal(signal.SIGTERM)
        assert wait_until(lambda: lifecycles(api) == {"worker-0": "draining"}, 2, 0.02)
        status = worker.popen.wait(timeout=0.5 + 2 + 5)
        listed, everyone = lifecycles(api), lifecycles(api, all="1")

    assert status == 0
    assert listed == {}  # not live any more
    assert everyone == {"worker-0": "stopped"}
