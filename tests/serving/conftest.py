"""Fixtures for the serving tests: real ONNX files, desired states, real workers."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import tritonclient.http as triton
from serving_testkit import (
    ThreadedWorker,
    make_config,
    relu_any_width,
    route,
    state,
    write_model,
    write_state,
)

from registry.building.onnx_build import random_mlp
from serving.console_client import ConsoleClient
from serving.repository import Repository


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def mlp_v1(model_dir):
    return write_model(model_dir, "mlp_v1", random_mlp([64, 128, 10], seed=1))


@pytest.fixture(scope="session")
def mlp_v2(model_dir):
    return write_model(model_dir, "mlp_v2", random_mlp([64, 128, 10], seed=2))


@pytest.fixture(scope="session")
def relu_model(model_dir):
    return write_model(model_dir, "relu", relu_any_width())


@pytest.fixture
def start_worker(tmp_path):
    """start_worker(desired_state, **config_overrides) -> a started ThreadedWorker."""
    started = []

    def start(desired: dict, **overrides) -> ThreadedWorker:
        state_file = write_state(tmp_path / f"state{len(started)}.json", desired)
        worker = ThreadedWorker(make_config(tmp_path, **overrides), state_file).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def digits_worker(start_worker, mlp_v1, mlp_v2):
    """digits v1 routed 100%, v2 unrouted at weight 0; this worker allows pinning v2
    (SERVING_ALLOW_PINNING_UNROUTED), the default refuses it."""
    v1, v2 = route(1, 100, *mlp_v1), route(2, 0, *mlp_v2)
    return start_worker(state(1, {"digits": {"routes": [v1, v2]}}), allow_pinning_unrouted=True)


@pytest.fixture
def client():
    with httpx.Client(timeout=10.0) as http:
        yield http


@pytest.fixture
async def repository(tmp_path):
    """A repository reading local artifacts, with a console that is never reached; closed
    after the test, since its versions' metric series live in the process-wide registry
    and a later test's worker in this process would serve them on its /metrics."""
    client = ConsoleClient("http://127.0.0.1:9", "", 1.0, allow_local=True)
    repository = Repository(make_config(tmp_path), "cpu", client.fetch_artifact)
    yield repository
    await repository.close()


@pytest.fixture
def triton_of():
    """triton_of(worker) -> a tritonclient.http client of that worker, closed after the test."""
    clients = []

    def connect(worker) -> triton.InferenceServerClient:
        clients.append(triton.InferenceServerClient(worker.url.removeprefix("http://")))
        return clients[-1]

    yield connect
    for client in clients:
        client.close()
