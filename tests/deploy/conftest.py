"""Fixtures for the deployment checks: a real worker after traffic, its /metrics text,
and the deployment files as Compose reads them."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from registry.building.onnx_build import random_mlp, to_bytes
from tests.deploy.consistency import REPO_ROOT, interpolate, required_variables
from tests.serving.serving_testkit import (
    SubprocessWorker,
    route,
    state,
    v2_body,
    write_state,
)

REQUESTS_SENT = 20
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def deploy_worker(tmp_path_factory) -> SubprocessWorker:
    """A real worker process per test module (``python -m serving.worker``; a session-wide one
    refused connections late in a full run, cause not found) serving model ``demo`` after
    traffic: successes, a 4xx, a request for an unknown model, a pinned request and a
    client-deadline 504, so every histogram and labelled counter has series."""
    tmp_path = tmp_path_factory.mktemp("deploy-worker")
    data = to_bytes(random_mlp([8, 16, 3], seed=7))
    model_path = tmp_path / "model.onnx"
    model_path.write_bytes(data)
    desired = state(1, {"demo": {"routes": [route(1, 100, model_path, hashlib.sha256(data).hexdigest())]}})
    worker = SubprocessWorker(write_state(tmp_path / "state.json", desired), tmp_path).wait_ready()
    try:
        with httpx.Client(base_url=worker.url, timeout=10.0) as client:
            batch = np.ones((2, 8), np.float32)
            for _ in range(REQUESTS_SENT):
                assert client.post("/v2/models/demo/infer", json=v2_body(batch)).status_code == 200
            assert client.post("/v2/models/demo/infer", json=v2_body(np.ones((1, 5), np.float32))).status_code == 400
            assert client.post("/v2/models/missing/infer", json=v2_body(batch)).status_code == 404
            # Counted apart from the split's traffic (serving/metrics.py): a pinned request,
            # and a 504 under a deadline the client shortened itself.
            assert client.post("/v2/models/demo/versions/1/infer", json=v2_body(batch)).status_code == 200
            refused = client.post("/v2/models/demo/infer", json=v2_body(batch), headers={"X-Request-Timeout-S": "0.000001"})
            assert refused.status_code == 504
        yield worker
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def worker_metrics(deploy_worker) -> str:
    """What ``GET /metrics`` of that real worker answers after its traffic."""
    response = httpx.get(f"{deploy_worker.url}/metrics", timeout=10.0)
    assert response.status_code == 200
    return response.text


def sample_environment(text: str) -> dict[str, str]:
    """A value for every variable the compose text requires, as a filled-in .env gives."""
    return {name: secrets.token_hex(32) for name in required_variables(text)}


def load_compose(path: Path, environment: dict[str, str] | None = None) -> dict:
    """``path`` as Compose reads it: YAML (merge keys resolved), then interpolated."""
    text = path.read_text()
    return interpolate(yaml.safe_load(text), sample_environment(text) if environment is None else environment)


@pytest.fixture(scope="session")
def compose() -> dict:
    """docker-compose.yml interpolated with every secret set and every default taken."""
    return load_compose(COMPOSE_FILE)


@pytest.fixture(scope="session")
def services(compose) -> dict[str, dict]:
    return compose["services"]
