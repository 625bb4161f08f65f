"""Sticky routing holds across processes: the routing key's bucket is a fixed function of
the key, never of a process (Python's hash() is salted per process by PYTHONHASHSEED),
so every worker sends a client to the same version."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from serving.traffic_split import RoutingTable, bucket_of, build_routes
from serving_testkit import REPO_ROOT, SubprocessWorker, route, state, v2_body, write_state

KEYS = [f"client-{index}" for index in range(300)] + ["", "ключ", "a" * 300]
SPLIT = {1: 50, 2: 50}

# Run in a fresh interpreter: the buckets and the versions the same split gives each key.
PROGRAM = """
import json, sys
from serving.traffic_split import RoutingTable, bucket_of, build_routes
keys, split = json.loads(sys.stdin.read())
table = RoutingTable(1, {"m": build_routes({int(v): w for v, w in split.items()}, {int(v): int(v) for v in split})})
print(json.dumps([[bucket_of(key) for key in keys if key], [table.resolve("m", None, key) for key in keys if key]]))
"""


def routes_here() -> list:
    table = RoutingTable(1, {"m": build_routes(SPLIT, {version: version for version in SPLIT})})
    return [[bucket_of(key) for key in KEYS if key], [table.resolve("m", None, key) for key in KEYS if key]]


def routes_in_a_process_with_hash_seed(seed: str) -> list:
    environment = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], input=json.dumps([KEYS, SPLIT]), capture_output=True, text=True,
        cwd=REPO_ROOT, env=environment, timeout=60, check=True,
    )
    return json.loads(done.stdout)


def test_routing_keys_land_in_the_same_bucket_and_version_in_every_process():
    here = routes_here()

    assert routes_in_a_process_with_hash_seed("1") == here
    assert routes_in_a_process_with_hash_seed("2") == here
    assert set(here[1]) == {1, 2}  # the keys do exercise both sides of the split


@pytest.fixture
def split_state(tmp_path, mlp_v1, mlp_v2):
    return state(1, {"digits": {"routes": [route(1, 50, *mlp_v1), route(2, 50, *mlp_v2)]}})


@pytest.fixture
def process_worker(tmp_path, split_state):
    """The worker as deployed, in its own process with its own hash seed."""
    worker = SubprocessWorker(write_state(tmp_path / "split.json", split_state), tmp_path, PYTHONHASHSEED="4242")
    try:
        yield worker.wait_ready()
    finally:
        worker.stop()


def served_version(client, url: str, key: str, *, predict: bool) -> int:
    headers = {"X-Routing-Key": key}
    if predict:
        response = client.post(url + "/predict", json={"model_name": "digits", "inputs": [0.0] * 64}, headers=headers)
    else:
        response = client.post(url + "/v2/models/digits/infer", json=v2_body(_zeros()), headers=headers)
    assert response.status_code == 200, response.text
    return int(response.headers["x-model-version"])


def _zeros():
    import numpy as np

    return np.zeros((1, 64), np.float32)


def test_the_routing_key_header_picks_the_same_version_on_every_request_and_every_worker(start_worker, process_worker, client, split_state):
    in_process = start_worker(split_state)
    keys = [f"client-{index}" for index in range(24)]
    expected = [1 if bucket_of(key) < 5_000 else 2 for key in keys]

    first = [served_version(client, in_process.url, key, predict=False) for key in keys]
    again = [served_version(client, in_process.url, key, predict=True) for key in keys]
    elsewhere = [served_version(client, process_worker.url, key, predict=index % 2 == 0) for index, key in enumerate(keys)]

    assert first == expected
    assert again == expected
    assert elsewhere == expected
    assert set(expected) == {1, 2}
