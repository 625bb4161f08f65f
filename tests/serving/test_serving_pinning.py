"""Pinned requests (`/v2/models/{m}/versions/{v}/infer`, `/predict` with `version`) reach
only routed versions: warm versions (rollback targets) and shadows are loaded for the
operators, not for clients, unless the worker sets SERVING_ALLOW_PINNING_UNROUTED."""

from __future__ import annotations

import numpy as np
import pytest

from serving.config import ServingConfig
from serving.reports import shadow_counts
from serving_testkit import ort_reference, route, state, v2_body

ONE_ROW = np.ones((1, 64), np.float32)


@pytest.fixture
def canary_state(mlp_v1, mlp_v2):
    """v1 stable at 99%, v2 canary at 1%, v3 (v1's bytes) shadowing, v4 (v2's bytes) warm."""
    routes = [route(1, 99, *mlp_v1), route(2, 1, *mlp_v2), {**route(3, 0, *mlp_v1), "shadow": 0.5}]
    return state(1, {"digits": {"routes": routes, "warm": [route(4, 0, *mlp_v2)]}})


def refusal(version: int) -> dict:
    return {"error": f"model 'digits' version {version} takes no traffic (it is only warm or a shadow); pinned requests may name only a routed version"}


def compared(version: int) -> int:
    row = shadow_counts().get(("digits", str(version)), {"compared": 0, "errors": 0})
    return row["compared"] + row["errors"]


@pytest.mark.parametrize("version", [3, 4])
def test_pinning_a_warm_or_shadow_version_is_refused(start_worker, client, canary_state, version):
    worker = start_worker(canary_state)
    before = compared(3)

    v2 = client.post(f"{worker.url}/v2/models/digits/versions/{version}/infer", json=v2_body(ONE_ROW))
    predict = client.post(worker.url + "/predict", json={"model_name": "digits", "version": version, "inputs": ONE_ROW[0].tolist()})

    assert (v2.status_code, v2.json()) == (404, refusal(version))
    assert (predict.status_code, predict.json()) == (404, refusal(version))
    assert "x-model-version" not in v2.headers and "x-model-version" not in predict.headers
    assert compared(3) == before  # nothing ran, nothing was mirrored


def test_pinning_the_one_percent_canary_is_served(start_worker, client, canary_state, mlp_v2):
    worker = start_worker(canary_state)

    response = client.post(worker.url + "/v2/models/digits/versions/2/infer", json=v2_body(ONE_ROW))

    assert response.status_code == 200
    assert response.headers["x-model-version"] == "2"
    np.testing.assert_allclose(response.json()["outputs"][0]["data"], ort_reference(mlp_v2[0], ONE_ROW)[0], atol=1e-5)


def test_a_worker_that_allows_it_serves_pinned_warm_and_shadow_versions(start_worker, client, canary_state, mlp_v1, mlp_v2):
    worker = start_worker(canary_state, allow_pinning_unrouted=True)

    warm = client.post(worker.url + "/v2/models/digits/versions/4/infer", json=v2_body(ONE_ROW))
    shadow = client.post(worker.url + "/predict", json={"model_name": "digits", "version": 3, "inputs": ONE_ROW[0].tolist()})

    assert (warm.status_code, warm.headers["x-model-version"]) == (200, "4")
    np.testing.assert_allclose(warm.json()["outputs"][0]["data"], ort_reference(mlp_v2[0], ONE_ROW)[0], atol=1e-5)
    assert (shadow.status_code, shadow.json()["model_version"]) == (200, 3)
    np.testing.assert_allclose(shadow.json()["outputs"]["probabilities"], ort_reference(mlp_v1[0], ONE_ROW)[0], atol=1e-5)


def test_the_setting_is_off_unless_the_environment_turns_it_on(monkeypatch):
    monkeypatch.delenv("SERVING_ALLOW_PINNING_UNROUTED", raising=False)
    assert ServingConfig.from_env().allow_pinning_unrouted is False

    monkeypatch.setenv("SERVING_ALLOW_PINNING_UNROUTED", "true")
    assert ServingConfig.from_env().allow_pinning_unrouted is True
