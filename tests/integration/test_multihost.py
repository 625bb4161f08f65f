"""The stack spread over hosts: Linux network namespaces (tests/fixtures/netns.py) with the
console, its PostgreSQL and Redis on a hub host and two workers on hosts of their own,
each at its own address behind a bridge. A worker's link is cut and restored at its
switch port, which a loopback-only stack cannot do: the worker is partitioned (timeouts,
no refusal) while it keeps running.

The tests share one stack and run in file order; each sets up the state it starts from,
so any one of them also runs alone (the last stops a worker for good). The test process
reaches the hosts from threads that entered the hub's namespace (``entered``): a socket
lives in the namespace of the thread that made it, so the HTTP clients are the real ones.
"""

from __future__ import annotations

import collections
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Self

import httpx
import pytest
from django.conf import settings

from tests.fixtures.netns import Host, Network, entered
from tests.fixtures.postgres_cluster import running_cluster
from tools.stack import REPO_ROOT, Process, Stack, make_stack, wait_until

pytestmark = [pytest.mark.integration]

ROW = [0.5] * 16
CONSOLE_PORT, WORKER_PORT, REDIS_PORT, POSTGRES_PORT = 8000, 8001, 6379, 5432  # each host's own: nothing else listens there
GONE_AFTER_S = 3.0  # WORKER_GONE_AFTER_S: a drill started at the cut still counts the cut worker
REPORT_INTERVAL_S = 0.5
DRILL_ACK_TIMEOUT_S = 3.0
DRAIN_DELAY_S = 1.0
DRAIN_TIMEOUT_S = 5.0
CONSOLE_TIMEOUT_S = 2.0  # SERVING_CONSOLE_TIMEOUT_S: bounds each call a cut-off worker makes to the console
UNREACHABLE_RETRY_S = 1.0  # how soon a worker that could not reach the console asks again (serving.control)
SLACK_S = 1.0  # the test's own polling and a loaded machine's scheduling
ACK_BOUND_S = 10.0
# After the link returns: the call made during the cut times out, the next reconcile
# comes a retry later, then the apply, the ack and the next report.
CATCH_UP_S = CONSOLE_TIMEOUT_S + UNREACHABLE_RETRY_S + 2 * REPORT_INTERVAL_S + 2 * SLACK_S
WAIT_S = 20.0  # how long a wait goes on before it gives up (the bounds asserted are tighter)
SEED_TIMEOUT_S = 120.0

SEED = """
import io
from django.contrib.auth.models import Group, User
from rest_framework.authtoken.models import Token
from registry.actions import uploads
from registry.models import RegisteredModel
from registry.building.onnx_build import random_mlp, to_bytes
user = User.objects.create_user("olivia", "")
user.groups.add(Group.objects.get_or_create(name="operator")[0])
model = RegisteredModel.objects.create(name="tiny")
for seed in (1, 2):
    uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([16, 8, 4], seed=seed))), uploaded_by=user)
print("TOKEN=" + Token.objects.create(user=user).key)
"""


@dataclass
class Fleet:
    network: Network
    stack: Stack
    operator_token: str
    workers: dict[str, Process]  # by worker id, which is the host's name in the test: w1, w2

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.stack.console.url, headers={"Authorization": f"Token {self.operator_token}"}, timeout=30)

    def desired_state(self) -> dict:
        """What the console issues now, as a worker reads it."""
        response = httpx.get(self.stack.console.url + "/api/serving/state", headers={"Authorization": f"Bearer {settings.SERVING_WORKER_TOKEN}"}, timeout=10)
        response.raise_for_status()
        return response.json()


@pytest.fixture(scope="module")
def fleet(netns_network: Network, tmp_path_factory) -> Iterator[Fleet]:
    hub = netns_network.hub
    work_dir = tmp_path_factory.mktemp("multihost")
    with running_cluster(hub.address, POSTGRES_PORT, hub.exec_prefix) as cluster, redis_server(hub, work_dir) as redis:
        stack = make_stack(
            work_dir, settings, cluster.settings_dict, command_prefix=hub.exec_prefix,
            REDIS_URL=redis.url, ARTIFACT_ROOT=str(work_dir / "artifacts"), ALLOWED_HOSTS=hub.address,
            WORKER_GONE_AFTER_S=str(GONE_AFTER_S), SERVING_REPORT_INTERVAL_S=str(REPORT_INTERVAL_S), DRILL_ACK_TIMEOUT_S=str(DRILL_ACK_TIMEOUT_S),
            SERVING_CONSOLE_TIMEOUT_S=str(CONSOLE_TIMEOUT_S),
            SERVING_DRAIN_DELAY_S=str(DRAIN_DELAY_S), SERVING_DRAIN_TIMEOUT_S=str(DRAIN_TIMEOUT_S),
        )
        try:
            with entered(hub):
                token = seeded_token(stack)
                stack.start_console(host=hub.address, port=CONSOLE_PORT)
                workers = {host.name.rsplit("-", 1)[1]: start_worker(stack, host) for host in netns_network.workers}
            yield Fleet(netns_network, stack, token, workers)
        finally:
            stack.stop()
            for process in [*stack.processes(), redis]:
                print(f"--- {process.name} ---\n{process.log()}")
            print(f"--- postgres ---\n{cluster.log()}")


@pytest.fixture(autouse=True)
def in_hub(fleet) -> Iterator[None]:
    """Each test talks to the hosts from the hub, as a machine on their network would."""
    with entered(fleet.network.hub):
        yield


@pytest.fixture
def api(fleet) -> Iterator[httpx.Client]:
    with fleet.api() as client:
        yield client


@contextmanager
def redis_server(host: Host, work_dir) -> Iterator[Process]:
    """A Redis of the test's own on ``host``, without persistence; stopped by PID afterwards."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("the multi-host test needs redis-server (Debian: redis-server)")
    log_path = work_dir / "redis.log"
    # Protected mode would answer other hosts DENIED; this network exists only inside the test's namespaces.
    command = [*host.exec_prefix, binary, "--bind", host.address, "--port", str(REDIS_PORT), "--protected-mode", "no",
               "--save", "", "--appendonly", "no", "--dir", str(work_dir)]
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    redis = Process("redis", f"redis://{host.address}:{REDIS_PORT}/0", popen, log_path)
    try:
        with entered(host):
            if not wait_until(lambda: answers_ping(host.address) or popen.poll() is not None, 10, 0.05) or popen.poll() is not None:
                raise RuntimeError(f"redis-server did not start on {host.address}:\n{redis.log()}")
        yield redis
    finally:
        redis.stop()


def answers_ping(address: str) -> bool:
    try:
        with socket.create_connection((address, REDIS_PORT), timeout=1) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def seeded_token(stack: Stack) -> str:
    """Migrate the hub's database, add the operator and ``tiny`` v1 (stable) and v2; the operator's token."""
    for args in (["migrate", "--noinput", "-v", "0"], ["shell", "-c", SEED]):
        done = subprocess.run([*stack.command_prefix, sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=stack.env,
                              capture_output=True, text=True, timeout=SEED_TIMEOUT_S, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    return next(line.removeprefix("TOKEN=") for line in done.stdout.splitlines() if line.startswith("TOKEN="))


def start_worker(stack: Stack, host: Host) -> Process:
    worker_id = host.name.rsplit("-", 1)[1]
    return stack.start_worker(host=host.address, port=WORKER_PORT, command_prefix=host.exec_prefix, SERVING_WORKER_ID=worker_id)


def listed(api: httpx.Client) -> dict[str, dict]:
    """The console's live workers by id."""
    return {row["worker_id"]: row for row in api.get("/api/workers/").json()}


def listed_exactly(api: httpx.Client, worker_ids: set[str]) -> dict[str, dict] | None:
    rows = listed(api)
    return rows if rows.keys() == worker_ids else None


def converged_by_digest(fleet: Fleet, api: httpx.Client, worker_ids: set[str]) -> dict | None:
    """The desired state once each of ``worker_ids`` reports serving its very digest."""
    state, rows = fleet.desired_state(), listed(api)
    proven = all(worker_id in rows and rows[worker_id]["digest"] == state["digest"] and rows[worker_id]["converged"] for worker_id in worker_ids)
    return state if proven else None


def release(api: httpx.Client, routes: list[dict]) -> int:
    response = api.post("/api/models/tiny/release/", json={"routes": routes})
    assert response.status_code == 201, response.text
    return response.json()["release"]["generation"]


def predict(worker: Process) -> httpx.Response:
    return httpx.post(worker.url + "/predict", json={"model_name": "tiny", "inputs": [ROW]}, timeout=10)


def routes_of(worker: Process) -> list:
    return httpx.get(worker.url + "/v2/models/tiny", timeout=5).json()["parameters"]["routes"]


def test_workers_on_their_own_hosts_register_at_their_addresses_and_serve_the_stable_version(fleet, api):
    rows = wait_until(lambda: listed_exactly(api, {"w1", "w2"}), 10)

    assert rows, listed(api)
    assert {worker_id: row["url"] for worker_id, row in rows.items()} == {"w1": "http://10.231.0.11:8001", "w2": "http://10.231.0.12:8001"}
    assert {worker_id: row["pid"] for worker_id, row in rows.items()} == {worker_id: process.popen.pid for worker_id, process in fleet.workers.items()}
    for worker in fleet.workers.values():
        answer = predict(worker)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model_version"] == 1


def test_both_workers_ack_a_canary_by_digest(fleet, api):
    started = time.monotonic()
    generation = release(api, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    state = wait_until(lambda: converged_by_digest(fleet, api, {"w1", "w2"}), ACK_BOUND_S, 0.05)
    acked_s = time.monotonic() - started

    print(f"canary generation {generation} acked by digest on both hosts after {acked_s:.2f} s")
    assert state is not None, listed(api)
    assert state["generation"] == generation
    for worker in fleet.workers.values():
        assert routes_of(worker) == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]


def test_a_cut_off_worker_is_marked_gone_in_time_and_a_drill_reports_it_unconfirmed(fleet, api):
    release(api, [{"version": 1, "weight": 80}, {"version": 2, "weight": 20}])  # something for the drill to roll back
    assert wait_until(lambda: converged_by_digest(fleet, api, {"w1", "w2"}), ACK_BOUND_S, 0.05), listed(api)
    drills: list = []

    with fleet.network.cut_off(fleet.network.workers[0]):
        cut_at = time.monotonic()
        drill = threading.Thread(target=run_drill, args=(fleet, drills))
        drill.start()
        gone = wait_until(lambda: listed_exactly(api, {"w2"}), GONE_AFTER_S + REPORT_INTERVAL_S + 10, 0.05)
        detected_s = time.monotonic() - cut_at
        drill.join(3 * DRILL_ACK_TIMEOUT_S + 10)

    print(f"cut-off worker unlisted after {detected_s:.2f} s (WORKER_GONE_AFTER_S={GONE_AFTER_S:g}, report interval {REPORT_INTERVAL_S:g} s); drill {drills}")
    assert gone, listed(api)
    assert GONE_AFTER_S - REPORT_INTERVAL_S - SLACK_S <= detected_s <= GONE_AFTER_S + REPORT_INTERVAL_S + SLACK_S
    assert not drill.is_alive()
    (answer,) = drills
    assert answer["status"] == "failed", answer
    rows = {row["worker"]: row for row in answer["workers"]}
    assert rows.keys() == {"w1", "w2"}
    assert rows["w1"]["ack_s"] is None and rows["w1"]["confirmed_s"] is None
    assert "no ack" in rows["w1"]["error"]
    assert rows["w2"]["ok"] is True and rows["w2"]["confirmed_s"] is not None
    assert "w1" in answer["error"] and "w2" not in answer["error"]


def run_drill(fleet: Fleet, answers: list) -> None:
    """A rollback drill, started at once from a thread of its own (it answers once every
    live worker acked or the ack timeout passed)."""
    with entered(fleet.network.hub), fleet.api() as api:
        response = api.post("/api/models/tiny/drills/", json={"roll_forward": False})
        answers.append(response.json() if response.status_code == 201 else {"status": response.status_code, "body": response.text})


def test_a_worker_whose_link_returns_catches_up_with_the_changes_it_missed(fleet, api):
    assert wait_until(lambda: converged_by_digest(fleet, api, {"w1", "w2"}), WAIT_S, 0.05), listed(api)
    cut_off = fleet.network.workers[0]

    with fleet.network.cut_off(cut_off):
        generation = release(api, [{"version": 2, "weight": 100}])
        assert wait_until(lambda: converged_by_digest(fleet, api, {"w2"}), ACK_BOUND_S, 0.05), listed(api)
        assert wait_until(lambda: "w1" not in listed(api), GONE_AFTER_S + REPORT_INTERVAL_S + 10, 0.05)
    restored_at = time.monotonic()
    state = wait_until(lambda: converged_by_digest(fleet, api, {"w1", "w2"}), WAIT_S, 0.05)
    caught_up_s = time.monotonic() - restored_at

    print(f"restored worker listed again serving generation {generation} by digest {caught_up_s:.2f} s after the link returned")
    assert state is not None, listed(api)
    assert state["generation"] == generation
    assert caught_up_s <= CATCH_UP_S
    assert routes_of(fleet.workers["w1"]) == [{"version": 2, "weight": 100}]
    assert predict(fleet.workers["w1"]).json()["model_version"] == 2


class RoundRobin:
    """Clients as a load balancer in front of the workers sends them: round robin over
    the workers whose readiness probe (every ``PROBE_INTERVAL_S``) passed last, over all
    of them when none did; a request refused at connect (nothing was sent) or answered
    503 "draining" goes to the next worker. Anything else is the answer the client gets:
    a failure unless it is a 200."""

    PROBE_INTERVAL_S = 0.1

    def __init__(self, hub: Host, urls: list[str], senders: int = 2):
        self.hub, self.urls = hub, urls
        self.ready = set(urls)
        self.outcomes: collections.Counter = collections.Counter()
        self.served_by: collections.Counter = collections.Counter()
        self.retries = 0
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._probe, daemon=True)] + [threading.Thread(target=self._send, daemon=True) for _ in range(senders)]

    def __enter__(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)

    @property
    def sent(self) -> int:
        return sum(self.outcomes.values())

    def _probe(self) -> None:
        with entered(self.hub), httpx.Client(timeout=0.5) as client:
            while not self._stop.wait(self.PROBE_INTERVAL_S):
                for url in self.urls:
                    try:
                        ready = client.get(url + "/v2/health/ready").status_code == 200
                    except httpx.HTTPError:
                        ready = False
                    with self._lock:
                        (self.ready.add if ready else self.ready.discard)(url)

    def _send(self) -> None:
        with entered(self.hub):
            clients = {url: httpx.Client(base_url=url, timeout=10) for url in self.urls}
            try:
                while not self._stop.is_set():
                    outcome, url = self._one_request(clients)
                    with self._lock:
                        self.outcomes[outcome] += 1
                        if outcome == 200:
                            self.served_by[url] += 1
            finally:
                for client in clients.values():
                    client.close()

    def _one_request(self, clients: dict[str, httpx.Client]) -> tuple[object, str | None]:
        for url in self._order():
            try:
                response = clients[url].post("/predict", json={"model_name": "tiny", "inputs": [ROW]})
            except httpx.ConnectError:
                self._retried()
                continue
            except httpx.HTTPError as error:
                return type(error).__name__, url
            if response.status_code == 503 and "draining" in response.text.lower():
                self._retried()
                continue
            return response.status_code, url
        return "no worker took it", None

    def _order(self) -> list[str]:
        with self._lock:
            candidates = [url for url in self.urls if url in self.ready] or list(self.urls)
        start = next(self._turn) % len(candidates)
        first = candidates[start:] + candidates[:start]
        return first + [url for url in self.urls if url not in first]

    def _retried(self) -> None:
        with self._lock:
            self.retries += 1


def test_a_worker_stopped_gracefully_under_load_drops_no_request(fleet, api):
    assert wait_until(lambda: listed_exactly(api, {"w1", "w2"}), WAIT_S), listed(api)
    survivor, stopping = fleet.workers["w1"], fleet.workers["w2"]

    with RoundRobin(fleet.network.hub, [survivor.url, stopping.url]) as load:
        assert wait_until(lambda: load.served_by[stopping.url] > 50 and load.served_by[survivor.url] > 50, 10), load.outcomes
        os.kill(stopping.popen.pid, signal.SIGTERM)
        stopped_at = time.monotonic()
        try:
            stopping.popen.wait(DRAIN_DELAY_S + DRAIN_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"w2 did not exit within {DRAIN_DELAY_S + DRAIN_TIMEOUT_S + 10:g} s of SIGTERM:\n{stopping.log()}")
        exited_s = time.monotonic() - stopped_at
        survivor_before = load.served_by[survivor.url]
        assert wait_until(lambda: load.served_by[survivor.url] > survivor_before + 200, 10), load.outcomes  # the survivor takes it all

    print(f"graceful stop under load: {load.sent} requests sent, outcomes {dict(load.outcomes)}, {load.retries} retried on the other worker; "
          f"w2 exited {stopping.popen.returncode} after {exited_s:.2f} s; served by {dict(load.served_by)}")
    assert set(load.outcomes) == {200}, load.outcomes
    assert stopping.popen.returncode == 0, stopping.log()
