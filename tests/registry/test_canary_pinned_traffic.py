"""A client cannot get a healthy canary rolled back by what it sends the canary alone.

A real worker serves the rollout's split (the canary is the stable version's model, so
it is healthy); a client pins the canary with malformed bodies and with a deadline of a
microsecond, which it answers 400 and 504, or finds a routing key the split sends to the
canary and sends malformed bodies under it. The worker's own report, posted as a worker
posts it, is judged by the rollout's analysis: those answers are not the canary's figures
(serving/metrics.py), so the window passes and the canary is promoted."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from django.utils import timezone

from registry.actions import rollouts
from registry.building.onnx_build import random_mlp
from registry.domain.choices import RolloutStatus
from registry.models import Rollout
from serving.contract import WorkerIdentity
from serving.reports import ReportBuilder
from tests.serving.serving_testkit import ThreadedWorker, make_config, route, state, v2_body, write_model, write_state

pytestmark = pytest.mark.django_db

# As the attack's rollout was started, but for the class-share gate at its ceiling: the split
# draws at random, so ~100 rows a side of one model differ in class shares by chance (once in
# CI: PSI 0.297, chi-square p 0.003 over 200 rows), and output drift is not what is judged here.
ANALYSIS = {"interval_s": 10, "min_requests": 50, "failure_limit": 2, "max_class_psi": 10}
IDENTITY = WorkerIdentity("w-canary", host="box", pid=1, url="http://127.0.0.1:9", device="cpu")


def start_split_worker(tmp_path, **config) -> ThreadedWorker:
    """digits v1 and v2 at 50 % each, both the same model (the registry's own fixture files
    differ by seed: a canary that answers otherwise would fail on its outputs)."""
    model = write_model(tmp_path, "digits", random_mlp([8, 4], seed=0))
    desired = state(1, {"digits": {"routes": [route(1, 50, *model), route(2, 50, *model)]}})
    return ThreadedWorker(make_config(tmp_path, **config), write_state(tmp_path / "state.json", desired)).start()


@pytest.fixture
def split_worker(tmp_path):
    worker = start_split_worker(tmp_path)
    yield worker
    worker.stop()


@pytest.fixture
def worker_trusting_routing_keys(tmp_path):
    worker = start_split_worker(tmp_path, trust_routing_key=True)  # a gateway in front sets X-Routing-Key
    yield worker
    worker.stop()


def report(worker, builder: ReportBuilder) -> dict:
    """The report the worker's control plane would send now (built on its loop)."""

    async def build():
        return builder.build(IDENTITY, worker.worker.repository)

    return asyncio.run_coroutine_threadsafe(build(), worker.loop).result(timeout=10).to_dict()


def test_pinned_malformed_and_tiny_deadline_requests_to_the_canary_do_not_roll_it_back(three_versions, operator, worker_client,
                                                                                         split_worker):
    rollout, builder, rows = start_rollout(three_versions, operator, split_worker)
    canary = f"{split_worker.url}/v2/models/digits/versions/2/infer"

    with httpx.Client(timeout=10.0) as client:
        send_split_traffic(client, split_worker.url, rows)
        attack = [client.post(canary, json={}) for _ in range(100)]
        attack += [client.post(canary, json=v2_body(rows[:1]), headers={"X-Request-Timeout-S": "0.000001"}) for _ in range(100)]
    assert sorted({answer.status_code for answer in attack}) == [400, 504]
    assert worker_client.post("/api/serving/reports", report(split_worker, builder), format="json").status_code == 204

    verdict = judge_now(rollout)

    assert (verdict.result, verdict.reason) == ("pass", verdict.reason)  # the reason shows on failure
    assert verdict.rollout.status == RolloutStatus.PROMOTED
    assert verdict.canary["requests"] + verdict.stable["requests"] == 200  # the split's traffic, and only it


def test_malformed_requests_sent_to_the_canary_under_a_routing_key_do_not_roll_it_back(three_versions, operator, worker_client,
                                                                                      split_worker):
    # An audit tried keys until X-Model-Version said the canary, then sent {} under that
    # key: 463 400s landed on the canary and the rollout rolled a healthy canary back.
    rollout, builder, rows = start_rollout(three_versions, operator, split_worker)

    with httpx.Client(timeout=10.0) as client:
        send_split_traffic(client, split_worker.url, rows)
        key = canary_key(client, split_worker.url, rows[0])
        attack = [client.post(f"{split_worker.url}/v2/models/digits/infer", json={}, headers={"X-Routing-Key": key}) for _ in range(100)]
    assert {answer.status_code for answer in attack} == {400}
    assert {answer.headers["x-model-version"] for answer in attack} == {"2"}
    assert worker_client.post("/api/serving/reports", report(split_worker, builder), format="json").status_code == 204

    verdict = judge_now(rollout)

    assert (verdict.result, verdict.reason) == ("pass", verdict.reason)
    assert verdict.canary["requests"] + verdict.stable["requests"] == 200


def test_keyed_requests_count_in_the_figures_when_a_gateway_is_trusted_to_set_the_key(three_versions, operator, worker_client,
                                                                                     worker_trusting_routing_keys):
    rollout, builder, rows = start_rollout(three_versions, operator, worker_trusting_routing_keys)

    with httpx.Client(timeout=10.0) as client:
        send_split_traffic(client, worker_trusting_routing_keys.url, rows, keyed=True)
    assert worker_client.post("/api/serving/reports", report(worker_trusting_routing_keys, builder), format="json").status_code == 204

    verdict = judge_now(rollout)

    assert verdict.canary["requests"] + verdict.stable["requests"] == 200


def start_rollout(model, operator, worker) -> tuple[Rollout, ReportBuilder, np.ndarray]:
    """The rollout of v2 at 50 %, the worker's report builder with its warm-up behind it,
    and 200 rows to send."""
    rollout = rollouts.start(model, 2, [50, 100], 0, ANALYSIS, operator)
    builder = ReportBuilder()
    report(worker, builder)
    return rollout, builder, np.random.default_rng(3).standard_normal((200, 8)).astype(np.float32)


def test_requests_with_an_empty_routing_key_are_the_splits_traffic(three_versions, operator, worker_client, split_worker):
    # An empty key chooses nothing (the split draws at random): counted apart, a proxy that
    # always sends the header would have left the analysis without data.
    rollout, builder, rows = start_rollout(three_versions, operator, split_worker)

    with httpx.Client(timeout=10.0) as client:
        send_split_traffic(client, split_worker.url, rows, headers={"X-Routing-Key": ""})
    assert worker_client.post("/api/serving/reports", report(split_worker, builder), format="json").status_code == 204

    verdict = judge_now(rollout)

    assert verdict.canary["requests"] + verdict.stable["requests"] == 200


def send_split_traffic(client: httpx.Client, url: str, rows: np.ndarray, *, keyed: bool = False, headers: dict | None = None) -> None:
    """One good request per row to the model, the split choosing the version (by a key per
    client, each always sent to the same side, when ``keyed``)."""
    for index, row in enumerate(rows):
        headers = {"X-Routing-Key": f"client-{index}"} if keyed else (headers or {})
        answer = client.post(f"{url}/v2/models/digits/infer", json=v2_body(row[None, :]), headers=headers)
        assert answer.status_code == 200


def canary_key(client: httpx.Client, url: str, row: np.ndarray) -> str:
    """A routing key the split sends to version 2, found as a client finds one."""
    for index in range(100):
        answer = client.post(f"{url}/v2/models/digits/infer", json=v2_body(row[None, :]), headers={"X-Routing-Key": f"probe-{index}"})
        if answer.headers["x-model-version"] == "2":
            return f"probe-{index}"
    raise AssertionError("no key of 100 reached version 2 at 50 %")


def judge_now(rollout: Rollout):
    """The rollout's first window, judged now."""
    # Due now, not at its time ahead: a tick ahead of the clock finds the reports just sent
    # seconds old, and a window waits for reports that stop short of its end.
    Rollout.objects.filter(pk=rollout.pk).update(next_window_at=timezone.now())
    rollouts.tick(timezone.now())
    rollout.refresh_from_db()
    return rollout.verdicts.get()
