"""Redis's data lost while it stays up (FLUSHALL, a failover to an empty replica, an
eviction policy that evicts the channel layer's keys): the workers' group membership
goes with it, though no connection breaks. Before the fix every push then went to no
one, and each change reached the workers only at their next reconcile (27.5 and 28.0 s
of a 30 s interval); a worker joins again every second now, so a change made two seconds
after the flush arrives by push. The Redis is this test's own (``redis_server``)."""

from __future__ import annotations

import subprocess
import time

import pytest
from django.db import connection

from tools.stack import running_stack, wait_until

from .test_redis_outage import issued_digest, serving_digest

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

RECONCILE_INTERVAL_S = 30.0


@pytest.fixture
def stack(tmp_path, settings, model, redis_server):
    with running_stack(tmp_path, settings, connection.settings_dict, REDIS_URL=redis_server.url,
                       SERVING_RECONCILE_INTERVAL_S=str(RECONCILE_INTERVAL_S)) as stack:
        yield stack


def test_a_change_made_after_redis_lost_its_data_reaches_every_worker_by_push(stack, api, settings, redis_server):
    stack.start_worker(), stack.start_worker()
    worker_ids = {"worker-0", "worker-1"}
    assert wait_until(lambda: serving_digest(api, worker_ids, *issued_digest(stack, settings)), 10)
    took = []
    for weight in (10, 50):
        subprocess.run(["redis-cli", "-p", str(redis_server.port), "FLUSHALL"], check=True, capture_output=True, timeout=10)
        time.sleep(2.0)  # past one re-join (REJOIN_EVERY_S)
        asked_at = time.monotonic()
        routes = [{"version": 1, "weight": 100 - weight}, {"version": 2, "weight": weight}]
        assert api.post("/api/models/tiny/release/", json={"routes": routes}).status_code == 201
        issued = issued_digest(stack, settings)
        converged = wait_until(lambda: serving_digest(api, worker_ids, *issued), RECONCILE_INTERVAL_S + 5, 0.1)
        took.append(round(time.monotonic() - asked_at, 2))
        assert converged
    print(f"converged after the change: {took} s")
    assert all(seconds < 4.0 for seconds in took), took
