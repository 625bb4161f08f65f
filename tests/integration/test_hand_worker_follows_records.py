"""A worker started by hand with ``manage.py serve``, given neither CONSOLE_URL nor
REDIS_URL, follows the addresses ``manage.py runstack`` recorded in DATA_DIR. When the
stack is started again elsewhere (its Redis on a new port because the old one was taken,
its console on another port) and the address in use stops answering, the worker reads
the record again and follows it, saying so in one line: pushes reach it over the new
Redis, and its downloads and reports go to the new console. Before, it retried the old
addresses for ever. A record that is no usable address changes nothing, and an address
the operator gave is never left.

Real processes: the test's own redis-servers (password-protected like runstack's,
stopped by PID), the console under uvicorn, the worker as ``manage.py serve``. The
records are written as runstack writes them (console/console_address.py)."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis
from django.db import connection
from rest_framework.authtoken.models import Token

from console import console_address
from tests.fixtures.redis_server import RedisServer
from tools.stack import running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# The worker's reconcile after its start comes 60 s later, far past every bound below:
# only the followed channel, or the followed console, can be fast enough.
RECONCILE_INTERVAL_S = "60"
FOLLOWED_WITHIN_S = 15.0  # re-join attempts come 0.5, 1.5, 3.5, 7.5, 15.5 s after the loss; the record is rewritten at once
ARRIVES_WITHIN_S = 10.0  # a push, a download of v2, its warm-up, on a loaded 2-core machine
SPLIT = [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]
PASSWORD = "stack-secret-7f3a"
BY_HAND = {"CONSOLE_URL": "", "REDIS_URL": ""}  # a worker started by hand: neither is set


@pytest.fixture(autouse=True)
def no_benchmarks(settings):
    """Before ``model``: its two versions' benchmarks (seconds each) have nothing to do with this."""
    settings.BENCHMARK_ENABLED = False


@pytest.fixture
def redis_servers(tmp_path):
    servers = [RedisServer(tmp_path), RedisServer(tmp_path)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def operator_headers(operator) -> dict:
    token, _ = Token.objects.get_or_create(user=operator)
    return {"Authorization": f"Token {token.key}"}


def start_locked(server: RedisServer) -> str:
    """Start ``server`` with a password, as runstack's embedded Redis has; its URL."""
    server.start()
    redis.Redis(host="127.0.0.1", port=server.port).config_set("requirepass", PASSWORD)
    return f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"


@contextmanager
def recorded_stack(tmp_path, settings, redis_url: str):
    """A console on ``redis_url``, both recorded in DATA_DIR as runstack records them."""
    with running_stack(tmp_path, settings, connection.settings_dict, REDIS_URL=redis_url,
                       SERVING_RECONCILE_INTERVAL_S=RECONCILE_INTERVAL_S) as stack:
        console_address.record(data_dir(stack), stack.console.url)
        console_address.record(data_dir(stack), redis_url, console_address.REDIS_FILE_NAME)
        yield stack


def data_dir(stack) -> Path:
    return Path(stack.env["DATA_DIR"])


def split_traffic(stack, headers) -> int:
    """The operator's change, made on the console as it runs now; its status."""
    return httpx.post(stack.console.url + "/api/models/tiny/release/", json={"routes": SPLIT}, headers=headers, timeout=30).status_code


def routes_of(worker) -> list:
    return httpx.get(worker.url + "/v2/models/tiny", timeout=5).json()["parameters"]["routes"]


def events(worker, name: str) -> list[dict]:
    """The worker's log lines (one JSON object each) of event ``name``."""
    found = []
    for line in worker.log_path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == name:
            found.append(record)
    return found


def joined(worker, times: int):
    return wait_until(lambda: len(events(worker, "channel_joined")) >= times, FOLLOWED_WITHIN_S, 0.1)


def reported_digest(stack, settings, headers) -> str | None:
    """The digest the console issues, once it shows worker-0 serving it."""
    issued = httpx.get(stack.console.url + "/api/serving/state", headers={"Authorization": f"Bearer {settings.SERVING_WORKER_TOKEN}"},
                       timeout=10).json()["digest"]
    rows = {row["worker_id"]: row for row in httpx.get(stack.console.url + "/api/workers/", headers=headers, timeout=10).json()}
    return issued if rows.get("worker-0", {}).get("digest") == issued else None


def test_a_hand_started_worker_follows_the_recorded_redis_to_its_new_port_and_hears_pushes_there(
        tmp_path, settings, model, redis_servers, operator_headers):
    old_redis, new_redis = redis_servers
    old_url = start_locked(old_redis)
    with recorded_stack(tmp_path, settings, old_url) as stack:
        worker = stack.start_worker(**BY_HAND)
        assert joined(worker, 1), worker.log()

        # The stack started again, on the same console port; its Redis found the old port taken.
        console_port = int(stack.console.url.rsplit(":", 1)[1])
        stack.console.stop()
        old_redis.stop()
        new_url = start_locked(new_redis)
        console_address.record(data_dir(stack), new_url, console_address.REDIS_FILE_NAME)
        stack.start_console(port=console_port, REDIS_URL=new_url)

        assert joined(worker, 2), worker.log()
        [followed] = events(worker, "recorded_address_followed")
        assert (followed["service"], followed["old"], followed["new"]) == (
            "redis", f"redis://:***@127.0.0.1:{old_redis.port}/0", f"redis://:***@127.0.0.1:{new_redis.port}/0")
        assert PASSWORD not in worker.log_path.read_text()

        assert split_traffic(stack, operator_headers) == 201
        assert wait_until(lambda: routes_of(worker) == SPLIT, ARRIVES_WITHIN_S, 0.1), worker.log()


def test_a_hand_started_worker_follows_the_recorded_console_to_its_new_address(
        tmp_path, settings, model, redis_servers, operator_headers):
    with recorded_stack(tmp_path, settings, start_locked(redis_servers[0])) as stack:
        worker = stack.start_worker(**BY_HAND)
        old_console = stack.console.url

        stack.console.stop()  # the stack started again, its console on another port
        stack.start_console()
        console_address.record(data_dir(stack), stack.console.url)

        assert wait_until(lambda: events(worker, "recorded_address_followed"), FOLLOWED_WITHIN_S, 0.1), worker.log()
        [followed] = events(worker, "recorded_address_followed")
        assert (followed["service"], followed["old"], followed["new"]) == ("console", old_console, stack.console.url)

        # Version 2 comes from the new console, and the worker's reports reach it.
        assert split_traffic(stack, operator_headers) == 201
        assert wait_until(lambda: routes_of(worker) == SPLIT, ARRIVES_WITHIN_S, 0.1), worker.log()
        assert wait_until(lambda: reported_digest(stack, settings, operator_headers), ARRIVES_WITHIN_S, 0.2), worker.log()


def test_a_malformed_record_is_logged_once_and_the_worker_keeps_the_address_it_has(
        tmp_path, settings, model, redis_servers, operator_headers):
    server = redis_servers[0]
    with recorded_stack(tmp_path, settings, start_locked(server)) as stack:
        worker = stack.start_worker(**BY_HAND)
        assert joined(worker, 1), worker.log()

        console_address.record(data_dir(stack), "redis://:x@127.0.0.1:notaport/0", console_address.REDIS_FILE_NAME)
        server.stop()
        assert wait_until(lambda: events(worker, "recorded_address_refused"), FOLLOWED_WITHIN_S, 0.1), worker.log()
        start_locked(server)  # on its old port: the worker never left it

        assert joined(worker, 2), worker.log()
        assert len(events(worker, "recorded_address_refused")) == 1
        assert events(worker, "recorded_address_followed") == []
        assert split_traffic(stack, operator_headers) == 201
        assert wait_until(lambda: routes_of(worker) == SPLIT, ARRIVES_WITHIN_S, 0.1), worker.log()


def test_a_redis_url_the_operator_gave_is_kept_whatever_the_record_says(tmp_path, settings, model, redis_servers):
    given, recorded_elsewhere = redis_servers
    given_url = start_locked(given)
    with recorded_stack(tmp_path, settings, given_url) as stack:
        worker = stack.start_worker(CONSOLE_URL="", REDIS_URL=given_url)
        assert joined(worker, 1), worker.log()

        given.stop()
        console_address.record(data_dir(stack), start_locked(recorded_elsewhere), console_address.REDIS_FILE_NAME)
        time.sleep(2.0)  # two re-join attempts (0.5 and 1.5 s after the loss): neither may follow the record
        assert events(worker, "recorded_address_followed") == []
        assert len(events(worker, "channel_joined")) == 1

        start_locked(given)
        assert joined(worker, 2), worker.log()
        assert events(worker, "recorded_address_followed") == []


def test_the_worker_reads_the_records_runstack_writes():
    # serve.py may not import console/ (tests/test_layering.py): the names are repeated there.
    from serving.management.commands import serve

    assert (serve.CONSOLE_RECORD, serve.REDIS_RECORD) == (console_address.FILE_NAME, console_address.REDIS_FILE_NAME)
