"""A real worker (uvicorn + the ASGI app) over HTTP: results, status codes, headers, metrics."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import orjson
import pytest

from serving_testkit import ort_reference, route, state, v2_body

INFER = "/v2/models/digits/infer"


def test_v2_infer_equals_raw_onnx_runtime_and_names_the_version(digits_worker, client, mlp_v1):
    batch = np.random.default_rng(3).standard_normal((3, 64), dtype=np.float32)

    response = client.post(digits_worker.url + INFER, json=v2_body(batch))

    document = response.json()
    assert response.status_code == 200
    assert response.headers["x-model-version"] == "1"
    assert document["model_version"] == "1"
    output = np.array(document["outputs"][0]["data"], np.float32).reshape(document["outputs"][0]["shape"])
    np.testing.assert_allclose(output, ort_reference(mlp_v1[0], batch), atol=1e-5)


def test_predict_one_row_equals_raw_onnx_runtime(digits_worker, client, mlp_v1):
    row = np.random.default_rng(4).standard_normal(64, dtype=np.float32)

    response = client.post(digits_worker.url + "/predict", json={"model_name": "digits", "inputs": row.tolist()})

    document = response.json()
    assert response.status_code == 200
    assert (document["model_name"], document["model_version"]) == ("digits", 1)
    assert document["request_id"] == response.headers["x-request-id"]
    expected = ort_reference(mlp_v1[0], row[np.newaxis])[0]
    np.testing.assert_allclose(document["outputs"]["probabilities"], expected, atol=1e-5)


def test_pinned_version_is_served_even_when_warm_and_unrouted(digits_worker, client, mlp_v2):
    batch = np.ones((1, 64), np.float32)

    response = client.post(digits_worker.url + "/v2/models/digits/versions/2/infer", json=v2_body(batch))

    assert response.headers["x-model-version"] == "2"
    np.testing.assert_allclose(response.json()["outputs"][0]["data"], ort_reference(mlp_v2[0], batch)[0], atol=1e-5)


def test_request_id_is_echoed(digits_worker, client):
    response = client.get(digits_worker.url + "/v2/health/live", headers={"X-Request-ID": "abc-123"})

    assert response.headers["x-request-id"] == "abc-123"


@pytest.mark.parametrize(
    ("method", "path", "content", "headers", "status", "error"),
    [
        ("POST", INFER, b"{oops", {}, 400, "not valid JSON"),
        ("POST", INFER, orjson.dumps(v2_body(np.zeros((1, 63), np.float32))), {}, 400, "input 'input': dimension 1 must be 64"),
        ("POST", INFER, b'{"inputs": [{"name": "input"}]}', {}, 400, "input 'input': datatype must be FP32"),
        ("POST", INFER, orjson.dumps(v2_body(np.zeros((1, 64), np.float32))), {"X-Request-Timeout-S": "soon"}, 400, "X-Request-Timeout-S"),
        ("POST", INFER, b"{}", {"Inference-Header-Content-Length": "-1"}, 400, "Inference-Header-Content-Length"),
        ("POST", INFER, b"{}", {"Content-Encoding": "gzip"}, 400, "Content-Encoding"),
        ("POST", "/predict", b'{"model_name": 5}', {}, 400, "'model_name' must be a non-empty string"),
        ("POST", "/predict", b'{"model_name": "digits", "inputs": "x"}', {}, 400, "'inputs' must be"),
        ("POST", "/v2/models/nope/infer", b"{}", {}, 404, "unknown model 'nope'"),
        ("POST", "/v2/models/digits/versions/9/infer", b"{}", {}, 404, "no loaded version '9'"),
        ("POST", "/v2/models/digits/versions/x/infer", b"{}", {}, 404, "no loaded version 'x'"),
        ("GET", "/v2/models/digits/versions/9", None, {}, 404, "no loaded version '9'"),
        ("GET", "/v3/anything", None, {}, 404, "no such endpoint"),
        ("GET", INFER, None, {}, 405, "use POST here"),
        ("POST", INFER, b"x" * (1024 * 1024 + 1), {}, 413, "exceeds the limit"),
    ],
)
def test_client_mistakes_get_their_status_and_a_json_error(digits_worker, client, method, path, content, headers, status, error):
    response = client.request(method, digits_worker.url + path, content=content, headers=headers)

    assert response.status_code == status
    assert error in response.json()["error"]


def test_request_past_its_deadline_gets_504(digits_worker, client):
    response = client.post(digits_worker.url + INFER, json=v2_body(np.zeros((1, 64), np.float32)),
                           headers={"X-Request-Timeout-S": "0.000001"})

    assert response.status_code == 504
    assert "deadline" in response.json()["error"]


def test_overload_past_the_latency_target_gets_503_with_retry_after(start_worker, client, mlp_v1):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}, latency_target_s=1e-7))

    response = client.post(worker.url + INFER, json=v2_body(np.zeros((1, 64), np.float32)))

    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert "overloaded" in response.json()["error"]


def test_model_with_nothing_routed_is_not_ready(start_worker, client, mlp_v1):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 0, *mlp_v1)]}}))

    response = client.post(worker.url + INFER, json=v2_body(np.zeros((1, 64), np.float32)))

    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert client.get(worker.url + "/v2/models/digits/ready").status_code == 503


def test_model_failure_is_a_500_with_the_request_id_and_no_details(digits_worker, client):
    version = digits_worker.worker.repository.loaded[("digits", 1)]

    def broken(feeds):
        raise RuntimeError("secret internals")

    version.engine.run = broken  # before the first request, so the batcher picks it up

    response = client.post(digits_worker.url + INFER, json=v2_body(np.zeros((1, 64), np.float32)),
                           headers={"X-Request-ID": "req-500"})

    assert response.status_code == 500
    assert response.json() == {"error": "internal error (request id req-500)"}


@pytest.mark.parametrize(
    "content",
    [b"", b"null", b"[]", b'{"inputs": null}', b'{"inputs": [1]}', b'{"inputs": [{"name": 1}]}',
     b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": {"a": 1}}]}',
     b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [1e999]}]}',
     b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "parameters": 3}]}',
     b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0]}], "outputs": 7}',
     b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0]}], "parameters": []}',
     b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [99999999999, 64], "data": [0]}]}',
     b"\xff\xfe", b'{"model_name": "digits", "version": "1", "inputs": [1]}'],
)
def test_malformed_bodies_never_produce_a_500(digits_worker, client, content):
    for path in (INFER, "/predict"):
        response = client.post(digits_worker.url + path, content=content)

        assert 400 <= response.status_code < 500, (path, response.text)
        assert "error" in response.json()


def test_concurrent_requests_are_batched(digits_worker):
    async def burst():
        async with httpx.AsyncClient(timeout=10.0, limits=httpx.Limits(max_connections=64)) as http:
            body = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))
            responses = await asyncio.gather(*(http.post(digits_worker.url + INFER, content=body) for _ in range(256)))
        return [response.status_code for response in responses]

    assert asyncio.run(burst()) == [200] * 256
    observer = digits_worker.worker.repository.loaded[("digits", 1)]._observer
    assert observer.counts["max_rows"] > 1
    assert observer.counts["batches"] < 256


def test_lone_request_does_not_wait_for_the_queue_window(start_worker, client, mlp_v1):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}, max_queue_delay_s=0.5))
    body = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))
    client.post(worker.url + INFER, content=body)

    elapsed = [client.post(worker.url + INFER, content=body).elapsed.total_seconds() for _ in range(5)]

    assert max(elapsed) < 0.1


def test_requests_of_different_shapes_never_share_a_batch(start_worker, relu_model):
    worker = start_worker(state(1, {"relu": {"routes": [route(1, 100, *relu_model)]}}))
    version = worker.worker.repository.loaded[("relu", 1)]
    shapes, original = [], version.engine.run
    version.engine.run = lambda feeds: shapes.append(feeds[0].shape) or original(feeds)

    async def burst():
        async with httpx.AsyncClient(timeout=10.0) as http:
            bodies = [v2_body(np.full((1, 3 + index % 2), -1.0 if index % 4 else 1.0, np.float32)) for index in range(64)]
            return await asyncio.gather(*(http.post(worker.url + "/v2/models/relu/infer", json=body) for body in bodies))

    responses = asyncio.run(burst())

    assert all(response.status_code == 200 for response in responses)
    assert {shape[1] for shape in shapes} == {3, 4}
    assert sum(shape[0] for shape in shapes) == 64
    assert [r.json()["outputs"][0]["shape"] for r in responses[:2]] == [[1, 3], [1, 4]]


def wait_for_more(items: list, count: int, timeout_s: float = 10.0) -> None:
    target, deadline = len(items) + count, time.monotonic() + timeout_s
    while len(items) < target and time.monotonic() < deadline:
        time.sleep(0.005)


def test_routing_swap_under_load_fails_no_request(start_worker, mlp_v1, mlp_v2):
    v1, v2 = route(1, 100, *mlp_v1), route(2, 100, *mlp_v2)
    worker = start_worker(state(1, {"digits": {"routes": [v1]}}))
    body = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))
    statuses, versions, stop = [], set(), threading.Event()

    def load():
        with httpx.Client(timeout=10.0) as http:
            while not stop.is_set():
                response = http.post(worker.url + INFER, content=body)
                statuses.append(response.status_code)
                versions.add(response.headers.get("x-model-version"))

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    for generation in range(2, 8):
        wait_for_more(statuses, 10)
        spec = [v2] if generation % 2 == 0 else [v1]
        assert worker.apply(state(generation, {"digits": {"routes": spec}}))["ok"] is True
    wait_for_more(statuses, 10)
    stop.set()
    for thread in threads:
        thread.join()

    assert set(statuses) == {200}
    assert versions == {"1", "2"}


def test_bad_sha256_is_refused_and_previous_routes_keep_serving(digits_worker, client, mlp_v2):
    forged = route(3, 100, mlp_v2[0], "f" * 64)

    result = digits_worker.apply(state(2, {"digits": {"routes": [forged]}}))

    assert result["ok"] is False and "sha256 mismatch" in result["error"]
    response = client.post(digits_worker.url + INFER, json=v2_body(np.zeros((1, 64), np.float32)))
    assert response.headers["x-model-version"] == "1"
    assert client.get(digits_worker.url + "/v2/models/digits").json()["parameters"]["generation"] == 1


def test_model_metadata_reports_routes_warm_versions_and_generation(digits_worker, client):
    document = client.get(digits_worker.url + "/v2/models/digits").json()

    assert document["name"] == "digits"
    assert document["versions"] == ["1", "2"]
    assert document["platform"] == "onnxruntime_onnx"
    assert document["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert document["parameters"] == {"generation": 1, "routes": [{"version": 1, "weight": 100}], "warm": [2], "shadows": [],
                                      "default_version": 1}


def test_health_endpoints(digits_worker, client):
    assert client.get(digits_worker.url + "/v2/health/live").status_code == 200
    assert client.get(digits_worker.url + "/v2/health/ready").status_code == 200
    assert client.get(digits_worker.url + "/v2").json()["extensions"] == ["binary_tensor_data"]
    assert client.get(digits_worker.url + "/v2/models/digits/versions/2/ready").status_code == 200
    health = client.get(digits_worker.url + "/health").json()
    assert (health["status"], health["device"], health["generation"]) == ("ready", "cpu", 1)
    assert health["models"]["digits"]["loaded"] == [1, 2]


def test_metrics_endpoint_exposes_the_named_series(digits_worker, client):
    client.post(digits_worker.url + INFER, json=v2_body(np.zeros((1, 64), np.float32)))

    text = client.get(digits_worker.url + "/metrics").text

    for series in (
        'modelops_requests_total{code="200",model="digits",version="1"}',
        "modelops_request_duration_seconds_bucket", "modelops_queue_duration_seconds_bucket",
        "modelops_compute_duration_seconds_bucket", "modelops_batch_size_bucket", "modelops_queue_depth",
        "modelops_loaded_versions", 'modelops_device_memory_used_bytes{device="cpu"}',
    ):
        assert series in text, series


def test_requests_past_the_in_flight_cap_get_503_before_the_body_is_read(start_worker, mlp_v1):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}), max_in_flight=1)
    version = worker.worker.repository.loaded[("digits", 1)]
    release, original = threading.Event(), version.engine.run
    version.engine.run = lambda feeds: release.wait(5) and original(feeds)
    body = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))

    async def held_and_shed():
        async with httpx.AsyncClient(timeout=10.0) as http:
            held = asyncio.ensure_future(http.post(worker.url + INFER, content=body))
            await asyncio.sleep(0.2)  # the first request now holds the only slot
            shed = await http.post(worker.url + INFER, content=b"{not even json", headers={"X-Request-ID": "shed-1"})
            release.set()
            return await held, shed

    held, shed = asyncio.run(held_and_shed())

    assert held.status_code == 200
    assert (shed.status_code, shed.headers["retry-after"], shed.headers["x-request-id"]) == (503, "1", "shed-1")
    assert "in flight" in shed.json()["error"]


def test_health_counts_a_failure_as_soon_as_it_is_answered(digits_worker, client):
    version = digits_worker.worker.repository.loaded[("digits", 1)]
    version.engine.run = lambda feeds: 1 / 0
    before = client.get(digits_worker.url + "/health").json()["requests_failed_total"]

    client.post(digits_worker.url + INFER, json=v2_body(np.zeros((1, 64), np.float32)))

    assert client.get(digits_worker.url + "/health").json()["requests_failed_total"] == before + 1
