"""Triton's model-configuration and statistics extensions, read by tritonclient from a real worker."""

from __future__ import annotations

import threading
import time

import numpy as np
import orjson
import pytest
from serving_testkit import HeldRun, route, state, v2_body

from serving.api_keys import digest

INFER = "/v2/models/digits/infer"


def infer(client, worker, rows: int = 1, seed: int = 0):
    batch = np.random.default_rng(seed).standard_normal((rows, 64), dtype=np.float32)
    return client.post(worker.url + INFER, content=orjson.dumps(v2_body(batch)))


def only_stat(triton_client, model: str = "digits", version: str = "1") -> dict:
    (stat,) = triton_client.get_inference_statistics(model, version)["model_stats"]
    return stat


# ---- model configuration -----------------------------------------------------------------


def test_config_of_a_batchable_version_leaves_out_the_batch_dimension(start_worker, triton_of, mlp_v1):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}, max_queue_delay_s=0.004),
                          max_batches_in_flight=2)

    config = triton_of(worker).get_model_config("digits")

    assert (config["name"], config["platform"], config["backend"]) == ("digits", "onnxruntime_onnx", "onnxruntime")
    assert config["max_batch_size"] == 16
    assert config["input"][0] | {"name": "input", "data_type": "TYPE_FP32", "dims": [64]} == config["input"][0]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("probabilities", "TYPE_FP32", [10])]
    assert config["dynamic_batching"]["preferred_batch_size"] == [16]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 4000
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 256
    assert config["dynamic_batching"]["default_queue_policy"]["default_timeout_microseconds"] == 5_000_000
    assert [(g["kind"], g["count"], g["gpus"]) for g in config["instance_group"]] == [("KIND_CPU", 2, [])]
    assert config["version_policy"] == {"specific": {"versions": [1]}}


def test_config_of_a_version_not_proven_batchable_has_max_batch_size_0_and_whole_dims(start_worker, triton_of, mlp_v1):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1, batchable=False)]}}))

    config = triton_of(worker).get_model_config("digits", "1")

    assert config["max_batch_size"] == 0
    assert config["input"][0]["dims"] == [-1, 64]
    assert config["output"][0]["dims"] == [-1, 10]
    assert "dynamic_batching" not in config


def test_config_without_a_version_describes_the_version_the_metadata_shows(start_worker, triton_of, mlp_v1, mlp_v2):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 30, *mlp_v1), route(2, 70, *mlp_v2)]}}))
    client = triton_of(worker)

    default, pinned = client.get_model_config("digits"), client.get_model_config("digits", "1")

    assert client.get_model_metadata("digits")["parameters"]["default_version"] == 2
    assert default["parameters"]["sha256"] == {"string_value": mlp_v2[1]}
    assert pinned["parameters"]["sha256"] == {"string_value": mlp_v1[1]}
    assert default["version_policy"] == {"specific": {"versions": [1, 2]}}


@pytest.mark.parametrize("suffix", ["/config", "/stats"])
@pytest.mark.parametrize("model_path", ["/v2/models/nope", "/v2/models/digits/versions/9"])
def test_unknown_model_or_version_answers_404_as_metadata_does(digits_worker, client, model_path, suffix):
    metadata = client.get(digits_worker.url + model_path)

    response = client.get(digits_worker.url + model_path + suffix)

    assert (response.status_code, response.json()) == (404, metadata.json())
    assert metadata.status_code == 404


@pytest.mark.parametrize("path", [
    "/v2/models/digits/versions/abc/config", "/v2/models/digits/versions/-1/stats", "/v2/models/digits/versions/9999999999/config",
    "/v2/models/digits/versions/config", "/v2/models/digits/config/extra", "/v2/models/digits/stats/stats",
    "/v2/models//config", "/v2/models/" + "x" * 5000 + "/stats",
])
def test_a_malformed_config_or_statistics_path_is_a_404_naming_no_more_than_a_clip_of_it(digits_worker, client, path):
    response = client.get(digits_worker.url + path)

    assert response.status_code == 404
    assert len(response.json()["error"]) < 200  # the path is quoted clipped, never echoed whole


def test_config_and_statistics_need_no_api_key_as_metadata(start_worker, client, mlp_v1):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}), api_keys="required")
    worker.worker.app.api_keys.replace(frozenset({digest(b"mk_good-key")}))

    for path in ("/v2/models/digits", "/v2/models/digits/config", "/v2/models/digits/stats", "/v2/models/stats"):
        assert client.get(worker.url + path).status_code == 200, path
    assert infer(client, worker).status_code == 401


def test_config_and_statistics_answer_only_get(digits_worker, client):
    response = client.post(digits_worker.url + "/v2/models/digits/config", content=b"{}")

    assert response.status_code == 405
    assert client.post(digits_worker.url + "/v2/models/stats", content=b"{}").status_code == 405


# ---- statistics ---------------------------------------------------------------------------


def test_statistics_of_a_fresh_version_are_zero(digits_worker, triton_of):
    stat = only_stat(triton_of(digits_worker))

    assert (stat["name"], stat["version"], stat["last_inference"]) == ("digits", "1", 0)
    assert (stat["inference_count"], stat["execution_count"], stat["batch_stats"]) == (0, 0, [])
    assert all(figure == {"count": 0, "ns": 0} for figure in stat["inference_stats"].values())
    assert set(stat["inference_stats"]) == {"success", "fail", "queue", "compute_input", "compute_infer",
                                            "compute_output", "cache_hit", "cache_miss"}


def test_statistics_count_each_inference_and_its_time(digits_worker, triton_of, client):
    started_ms = time.time() * 1000
    for seed in range(5):
        assert infer(client, digits_worker, seed=seed).status_code == 200

    stat = only_stat(triton_of(digits_worker))

    figures = stat["inference_stats"]
    assert (stat["inference_count"], stat["execution_count"]) == (5, 5)  # one at a time: no company to batch with
    assert figures["success"]["count"] == figures["queue"]["count"] == figures["compute_infer"]["count"] == 5
    assert figures["success"]["ns"] > figures["compute_infer"]["ns"] > 0
    assert figures["queue"]["ns"] > 0
    assert figures["fail"] == {"count": 0, "ns": 0}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stat["batch_stats"]] == [(1, 5)]
    assert started_ms - 1 <= stat["last_inference"] <= time.time() * 1000 + 1


def test_a_request_of_several_rows_is_several_inferences_in_one_execution(digits_worker, triton_of, client):
    assert infer(client, digits_worker, rows=4).status_code == 200

    stat = only_stat(triton_of(digits_worker))

    assert (stat["inference_count"], stat["execution_count"]) == (4, 1)
    assert stat["inference_stats"]["success"]["count"] == 1
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stat["batch_stats"]] == [(4, 1)]


def test_requests_batched_together_are_one_execution_each_charged_its_compute(digits_worker, triton_of, client):
    """One request held in the engine, three queued behind it: they run as one batch of 3."""
    version = digits_worker.worker.repository.loaded[("digits", 1)]
    held = version.engine.run = HeldRun(version.engine.run)
    senders = [threading.Thread(target=infer, args=(client, digits_worker)) for _ in range(4)]
    senders[0].start()
    assert held.entered.wait(5)
    for sender in senders[1:]:
        sender.start()
    wait_for(lambda: version.queue_depth == 3)
    held.release.set()
    for sender in senders:
        sender.join(10)

    stat = only_stat(triton_of(digits_worker))

    assert (stat["inference_count"], stat["execution_count"]) == (4, 2)
    assert held.rows == [1, 3]
    by_size = {b["batch_size"]: b["compute_infer"] for b in stat["batch_stats"]}
    assert sorted(by_size) == [1, 3] and by_size[1]["count"] == by_size[3]["count"] == 1
    # Each of the 3 requests is charged the whole batch's time, as Triton charges them.
    assert stat["inference_stats"]["compute_infer"]["ns"] == by_size[1]["ns"] + 3 * by_size[3]["ns"]
    assert stat["inference_stats"]["compute_infer"]["count"] == 4


def test_a_request_refused_by_the_version_counts_as_a_failure(digits_worker, triton_of, client):
    bad = client.post(digits_worker.url + INFER, content=orjson.dumps(v2_body(np.zeros((1, 3), np.float32))))

    stat = only_stat(triton_of(digits_worker))

    assert bad.status_code == 400
    assert stat["inference_stats"]["fail"]["count"] == 1 and stat["inference_stats"]["fail"]["ns"] > 0
    assert stat["inference_stats"]["success"] == {"count": 0, "ns": 0}
    assert (stat["inference_count"], stat["execution_count"]) == (0, 0)


def test_reading_metadata_config_or_statistics_is_no_inference(digits_worker, triton_of, client):
    for path in ("/v2/models/digits/versions/1", "/v2/models/digits/versions/1/config",
                 "/v2/models/digits/versions/1/stats", "/v2/models/digits/versions/1/ready"):
        assert client.get(digits_worker.url + path).status_code == 200, path

    stat = only_stat(triton_of(digits_worker))

    assert stat["inference_stats"]["success"] == {"count": 0, "ns": 0}


def test_statistics_paths_narrow_from_every_model_to_one_version(start_worker, triton_of, mlp_v1, mlp_v2, relu_model):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1), route(2, 0, *mlp_v2)]},
                                    "relu": {"routes": [route(3, 100, *relu_model)]}}))
    client = triton_of(worker)

    def listed(**narrowing) -> list[tuple[str, str]]:
        return [(s["name"], s["version"]) for s in client.get_inference_statistics(**narrowing)["model_stats"]]

    assert listed() == [("digits", "1"), ("digits", "2"), ("relu", "3")]
    assert listed(model_name="digits") == [("digits", "1"), ("digits", "2")]
    assert listed(model_name="digits", model_version="2") == [("digits", "2")]


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)
