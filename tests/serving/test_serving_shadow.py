"""Shadow routes: mirrored after the answer, compared, never answering clients."""

from __future__ import annotations

import asyncio

import numpy as np

from serving import reports
from serving.shadow import outputs_agree
from serving_testkit import route, state


def test_same_top_class_counts_as_agreement():
    served = [np.array([[0.1, 0.9], [0.8, 0.2]], np.float32)]
    shadow = [np.array([[0.3, 0.7], [0.6, 0.4]], np.float32)]

    assert outputs_agree(served, shadow)


def test_a_different_top_class_is_a_disagreement():
    served = [np.array([[0.1, 0.9]], np.float32)]
    shadow = [np.array([[0.9, 0.1]], np.float32)]

    assert not outputs_agree(served, shadow)


def test_non_class_outputs_agree_within_the_tolerance_only():
    served = [np.array([1.0, 2.0], np.float32)]

    assert outputs_agree(served, [np.array([1.0005, 2.0], np.float32)])
    assert not outputs_agree(served, [np.array([1.01, 2.0], np.float32)])


def test_different_shapes_never_agree():
    assert not outputs_agree([np.zeros((2, 3))], [np.zeros((3, 2))])


def shadow_counts(model: str, version: int) -> dict:
    return reports.shadow_counts().get((model, str(version)), {"compared": 0, "agreed": 0})


def mirrors_finished(worker, timeout_s: float = 5.0) -> None:
    """Wait on the worker's own loop until every mirror scheduled so far has been counted:
    an answer leaves only after its mirror is scheduled, so no fixed sleep is needed."""
    finished = asyncio.run_coroutine_threadsafe(worker.worker.dataplane.shadow.wait_idle(timeout_s), worker.loop)
    assert finished.result(timeout=timeout_s + 1), f"shadow mirrors still running after {timeout_s} s"


def test_shadow_version_is_compared_but_never_answers(start_worker, client, mlp_v1, mlp_v2):
    shadow_route = {**route(2, 0, *mlp_v2), "shadow": 1.0}
    worker = start_worker(state(1, {"shadowed": {"routes": [route(1, 100, *mlp_v1), shadow_route]}}))
    before = shadow_counts("shadowed", 2)
    rows = np.random.default_rng(5).standard_normal((20, 64), dtype=np.float32)

    served = [client.post(worker.url + "/predict", json={"model_name": "shadowed", "inputs": row.tolist()}).json()["model_version"] for row in rows]
    mirrors_finished(worker)

    assert served == [1] * 20
    after = shadow_counts("shadowed", 2)
    assert after["compared"] - before["compared"] == 20
    metadata = client.get(worker.url + "/v2/models/shadowed").json()
    assert metadata["parameters"]["shadows"] == [{"version": 2, "shadow": 1.0}]


def test_identical_shadow_agrees_every_time(start_worker, client, mlp_v1):
    shadow_route = {**route(2, 0, *mlp_v1), "shadow": 1.0}
    worker = start_worker(state(1, {"twin": {"routes": [route(1, 100, *mlp_v1), shadow_route]}}))
    rows = np.random.default_rng(6).standard_normal((10, 64), dtype=np.float32)

    for row in rows:
        client.post(worker.url + "/predict", json={"model_name": "twin", "inputs": row.tolist()})
    mirrors_finished(worker)

    assert shadow_counts("twin", 2) == {"compared": 10, "agreed": 10, "errors": 0, "dropped": 0}


def test_pinned_requests_are_not_mirrored(start_worker, client, mlp_v1):
    shadow_route = {**route(2, 0, *mlp_v1), "shadow": 1.0}
    worker = start_worker(state(1, {"pinned": {"routes": [route(1, 100, *mlp_v1), shadow_route]}}))

    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}

    pinned = client.post(worker.url + "/v2/models/pinned/versions/1/infer", json=body)
    mirrors_finished(worker)
    after_pinned = shadow_counts("pinned", 2)["compared"]
    routed = client.post(worker.url + "/v2/models/pinned/infer", json=body)
    mirrors_finished(worker)

    assert (pinned.status_code, routed.status_code) == (200, 200)
    assert after_pinned == 0
    assert shadow_counts("pinned", 2)["compared"] == 1  # the same request unpinned is mirrored
