"""A real worker (uvicorn + the ASGI app) over HTTP: results, status codes, headers, metrics."""

from __future__ import annotations

import asyncio
import socket
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
        # "must be positive" for infinity read as a contradiction
        ("POST", INFER, orjson.dumps(v2_body(np.zeros((1, 64), np.float32))), {"X-Request-Timeout-S": "inf"}, 400,
         "header X-Request-Timeout-S must be a positive, finite number of seconds"),
        ("POST", INFER, orjson.dumps(v2_body(np.zeros((1, 64), np.float32))), {"X-Request-Timeout-S": "nan"}, 400,
         "header X-Request-Timeout-S must be a positive, finite number of seconds"),
        ("POST", INFER, b"{}", {"Inference-Header-Content-Length": "-1"}, 400, "Inference-Header-Content-Length"),
        ("POST", INFER, b"{}", {"Content-Encoding": "gzip"}, 400, "Content-Encoding"),
        ("POST", "/predict", b'{"model_name": 5}', {}, 400, "'model_name' must be a non-empty string"),
        ("POST", "/predict", b'{"model_name": "digits", "inputs": "x"}', {}, 400, "'inputs' must be"),
        # A misspelt pin was ignored: the split answered, from any version.
        ("POST", "/predict", b'{"model_name": "digits", "inputs": [[0]], "verison": 1}', {}, 400,
         "'verison' is not a /predict key: it takes 'model_name', 'inputs' and, to pin a version, 'version'"),
        ("POST", "/predict", b'{"model_name": "digits", "inputs": [[0]], "version": 99999999999999999999999}', {}, 400,
         "'version' must be a positive integer (a version number), not 1e+23"),
        ("POST", "/v2/models/nope/infer", b"{}", {}, 404, "unknown model 'nope'"),
        ("POST", "/v2/models/digits/versions/9/infer", b"{}", {}, 404, "no loaded version '9'"),
        ("POST", "/v2/models/digits/versions/x/infer", b"{}", {}, 404, "no loaded version 'x'"),
        ("POST", "/v2/models/digits/versions/%C2%B2/infer", b"{}", {}, 404, "no loaded version '²'"),  # a digit to str.isdigit
        ("GET", "/v2/models/digits/versions/%D9%A1", None, {}, 404, "no loaded version '١'"),  # Arabic-Indic 1: not version 1
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


def test_a_routed_model_that_could_not_load_here_is_a_503_naming_it_at_every_endpoint(start_worker, client, mlp_v1):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}))
    worker.apply(state(2, {"digits": {"routes": [route(1, 100, *mlp_v1)]}, "other": {"routes": [route(1, 100, mlp_v1[0], "0" * 64)]}}))
    why = "model 'other' could not be loaded on this worker; its log says why"

    answers = [client.post(worker.url + "/v2/models/other/infer", json=v2_body(np.zeros((1, 64), np.float32))),
               client.post(worker.url + "/v2/models/other/versions/1/infer", json=v2_body(np.zeros((1, 64), np.float32))),
               client.post(worker.url + "/predict", json={"model_name": "other", "inputs": [[0.0] * 64]}),
               client.get(worker.url + "/v2/models/other")]

    assert [(answer.status_code, answer.json()["error"]) for answer in answers] == [(503, why)] * 4
    assert client.get(worker.url + "/v2/models/other/ready").status_code == 503
    assert client.post(worker.url + INFER, json=v2_body(np.zeros((1, 64), np.float32))).status_code == 200


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
                try:
                    response = http.post(worker.url + INFER, content=body)
                except httpx.HTTPError as error:  # counted, not lost with a thread that died of it
                    statuses.append(type(error).__name__)
                    continue
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


def test_a_request_routed_before_a_swap_is_answered_by_the_version_it_was_routed_to(start_worker, mlp_v1, mlp_v2):
    # Its headers arrive, it is routed to v1; v1 is retired while its body is still on the
    # way. The retiring version's drain must wait for it, not only for what is queued.
    v1, v2 = route(1, 100, *mlp_v1), route(2, 100, *mlp_v2)
    worker = start_worker(state(1, {"digits": {"routes": [v1]}}))
    body = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))
    head = (f"POST {INFER} HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", worker.port), timeout=10) as held:
        held.sendall(head)
        time.sleep(0.3)  # routed, now waiting for its body
        swap = asyncio.run_coroutine_threadsafe(worker.worker.apply(state(2, {"digits": {"routes": [v2]}})), worker.loop)
        deadline = time.monotonic() + 10
        while httpx.post(worker.url + INFER, content=body).headers.get("x-model-version") != "2":
            assert time.monotonic() < deadline, "the swap to v2 did not happen"
        acked = swap.result(timeout=2)  # the ack does not wait for the slow client (the drain bound is 5 s)
        held.sendall(body)
        answer = held.recv(65536)

    assert acked["ok"] is True
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b"x-model-version: 1\r\n" in answer


def test_a_client_that_hangs_up_mid_body_does_not_hold_its_retired_version(start_worker, mlp_v1, mlp_v2):
    # The hold is released when the client goes away: v1 unloads (its series leave
    # /metrics) well before the 5 s drain bound, not at it.
    v1, v2 = route(1, 100, *mlp_v1), route(2, 100, *mlp_v2)
    worker = start_worker(state(1, {"digits": {"routes": [v1]}}))
    body = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))
    httpx.post(worker.url + INFER, content=body)  # v1 has series to lose
    head = (f"POST {INFER} HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", worker.port), timeout=10) as held:
        held.sendall(head + body[:10])
        time.sleep(0.3)
    assert worker.apply(state(2, {"digits": {"routes": [v2]}}))["ok"] is True

    deadline = time.monotonic() + 2.0
    # This model's series only: the registry is the process's, shared with every other
    # repository a test left in it.
    while 'model="digits",version="1"' in httpx.get(worker.url + "/metrics").text:
        assert time.monotonic() < deadline, "v1 still loaded: the abandoned request kept holding it"
        time.sleep(0.05)


def test_a_request_outliving_the_drain_bound_of_its_retired_version_is_a_prompt_503(start_worker, mlp_v1, mlp_v2):
    v1, v2 = route(1, 100, *mlp_v1), route(2, 100, *mlp_v2)
    worker = start_worker(state(1, {"digits": {"routes": [v1]}}), drain_timeout_s=0.2)
    body = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))
    head = (f"POST {INFER} HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", worker.port), timeout=10) as held:
        held.sendall(head)
        time.sleep(0.3)
        assert worker.apply(state(2, {"digits": {"routes": [v2]}}))["ok"] is True
        time.sleep(0.5)  # past the 0.2 s drain bound: v1 closed
        held.sendall(body)
        answer = held.recv(65536)

    assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
    assert b"unloaded" in answer


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
    assert client.get(digits_worker.url + "/v2").json()["extensions"] == ["binary_tensor_data", "model_configuration", "statistics"]
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


def test_metrics_show_the_generation_of_the_state_last_applied(start_worker, client, mlp_v1):
    digits = {"digits": {"routes": [route(1, 100, *mlp_v1)]}}
    worker = start_worker(state(3, digits))
    assert worker.apply(state(7, digits))["ok"]

    refused = worker.apply({"generation": 8, "models": "not a map"})

    assert not refused["ok"]
    assert "modelops_state_generation 7.0" in client.get(worker.url + "/metrics").text.splitlines()


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


def test_an_overloaded_version_refuses_a_request_before_its_body_arrives(start_worker, mlp_v1):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}, max_queue_size=1))
    version = worker.worker.repository.loaded[("digits", 1)]
    release, original = threading.Event(), version.engine.run
    version.engine.run = lambda feeds: release.wait(5) and original(feeds)
    body = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))
    port = int(worker.url.rsplit(":", 1)[1])

    async def fill_queue_then_send_headers_only():
        async with httpx.AsyncClient(timeout=10.0) as http:
            running = asyncio.ensure_future(http.post(worker.url + INFER, content=body))
            await asyncio.sleep(0.2)  # the engine now holds the first request
            queued = asyncio.ensure_future(http.post(worker.url + INFER, content=body))
            await asyncio.sleep(0.2)  # the second fills the queue of one
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])  # the rest never comes
            answer = await asyncio.wait_for(reader.read(4096), timeout=3.0)
            writer.close()
            release.set()
            return answer, await running, await queued

    answer, running, queued = asyncio.run(fill_queue_then_send_headers_only())

    assert answer.startswith(b"HTTP/1.1 503 ")
    assert b"retry-after: 1" in answer.lower()
    assert b'{"error":"queue full (1 requests)"}' in answer
    assert (running.status_code, queued.status_code) == (200, 200)


def test_health_counts_a_failure_as_soon_as_it_is_answered(digits_worker, client):
    version = digits_worker.worker.repository.loaded[("digits", 1)]
    version.engine.run = lambda feeds: 1 / 0
    before = client.get(digits_worker.url + "/health").json()["requests_failed_total"]

    client.post(digits_worker.url + INFER, json=v2_body(np.zeros((1, 64), np.float32)))

    assert client.get(digits_worker.url + "/health").json()["requests_failed_total"] == before + 1


def test_a_request_asking_for_one_output_thousands_of_times_is_a_small_fast_400(digits_worker, client):
    request = {**v2_body(np.zeros((1, 64), np.float32)), "outputs": [{"name": "probabilities"}] * 2800}
    content = orjson.dumps(request)
    assert len(content) > 59_000

    response = client.post(digits_worker.url + INFER, content=content)

    assert response.status_code == 400
    assert response.json() == {"error": "output 'probabilities': requested more than once"}
    assert len(response.content) < 200
    assert response.elapsed.total_seconds() < 1.0


@pytest.mark.parametrize(
    ("data", "error"),
    [(["0.5"] * 64, "input 'input': FP32 data must hold numbers, found a string"),
     (["NaN"] + [0.0] * 63, "input 'input': FP32 data must hold numbers, found a string"),
     ([None] * 64, "input 'input': FP32 data must hold numbers, found null"),
     ([True] * 64, "input 'input': FP32 data must hold numbers, found a boolean")],
)
def test_json_tensor_data_of_the_wrong_type_is_a_400_and_nothing_is_computed(digits_worker, client, data, error):
    version = digits_worker.worker.repository.loaded[("digits", 1)]
    calls, original = [], version.engine.run
    version.engine.run = lambda feeds: calls.append(1) or original(feeds)
    content = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": data}]})
    rows = orjson.dumps({"model_name": "digits", "inputs": [data]})

    answers = [client.post(digits_worker.url + INFER, content=content), client.post(digits_worker.url + "/predict", content=rows)]

    assert [(answer.status_code, answer.json()) for answer in answers] == [(400, {"error": error})] * 2
    assert calls == []


def test_non_finite_outputs_are_words_in_json_answers_and_bits_in_binary_ones(start_worker, client, relu_model):
    worker = start_worker(state(1, {"relu": {"routes": [route(1, 100, *relu_model)]}}))
    batch = np.array([[np.nan, np.inf, -1.0, 2.0]], np.float32)
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 16}}]})

    response = client.post(worker.url + "/v2/models/relu/infer", content=header + batch.tobytes(),
                           headers={"Inference-Header-Content-Length": str(len(header))})

    assert response.status_code == 200
    assert orjson.loads(response.content)["outputs"][0]["data"] == ["NaN", "Infinity", 0.0, 2.0]


@pytest.mark.parametrize("value", ["9" * 5000, "-5", "+5", "99999999", "1_2"])  # "0": the whole body is JSON, as Triton reads it
def test_absurd_inference_header_content_length_is_a_400(digits_worker, client, value):
    content = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))

    response = client.post(digits_worker.url + INFER, content=content, headers={"Inference-Header-Content-Length": value})

    assert response.status_code == 400
    assert "Inference-Header-Content-Length" in response.json()["error"]
    assert len(response.content) < 200


@pytest.mark.parametrize(
    ("path", "content_type"),
    [(INFER, "text/plain"), (INFER, "application/x-www-form-urlencoded"), (INFER, "multipart/form-data; boundary=x"),
     ("/predict", "application/octet-stream"), ("/predict", "text/plain;charset=utf-8"), (INFER, "x" * 3000)],
)
def test_a_body_labelled_neither_json_nor_octet_stream_is_a_415(digits_worker, client, path, content_type):
    content = orjson.dumps({"model_name": "digits", **v2_body(np.zeros((1, 64), np.float32))})

    response = client.post(digits_worker.url + path, content=content, headers={"Content-Type": content_type})

    assert response.status_code == 415
    assert "is not supported here" in response.json()["error"]
    assert len(response.content) < 250


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-7", "application/json;charset=\"UTF-16\"",
                                          "application/json; charset=latin-1", "application/json; charset=unicode_escape"])
@pytest.mark.parametrize("path", [INFER, "/predict"])
def test_json_in_a_charset_other_than_utf_8_is_a_415_naming_it(digits_worker, client, path, content_type):
    """The worker read any charset's body as UTF-8, where a proxy in front that honours the
    label reads other text (UTF-7's +ACI- is a quote): as the console's API, a 415."""
    content = orjson.dumps({"model_name": "digits", "inputs": [[0.0] * 64]} if path == "/predict" else v2_body(np.zeros((1, 64), np.float32)))

    response = client.post(digits_worker.url + path, content=content, headers={"Content-Type": content_type})

    assert response.status_code == 415
    assert "charset" in response.json()["error"] and "UTF-8" in response.json()["error"]


@pytest.mark.parametrize("content_type", [None, "application/json", "Application/JSON; charset=utf-8", "application/json; charset=\"UTF-8\"",
                                          "application/json; charset=us-ascii", "application/octet-stream"])
def test_json_unlabelled_and_octet_stream_bodies_are_served(digits_worker, client, content_type):
    headers = {"Content-Type": content_type} if content_type else {}

    response = client.post(digits_worker.url + INFER, content=orjson.dumps(v2_body(np.zeros((1, 64), np.float32))), headers=headers)

    assert response.status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/" + "a" * 5000), ("POST", "/v2/models/" + "m" * 5000 + "/infer"),
     ("GET", "/v2/models/digits/versions/" + "9" * 5000), ("GET", "/v2/models/" + "m" * 5000 + "/x")],
)
def test_errors_echo_only_a_short_prefix_of_the_path(digits_worker, client, method, path):
    response = client.request(method, digits_worker.url + path, content=b"{}" if method == "POST" else None)

    assert response.status_code == 404
    assert len(response.json()["error"]) < 200


@pytest.mark.parametrize("path", ["/metrics", "/health"])
def test_metrics_and_health_can_require_the_worker_token(start_worker, client, mlp_v1, path):
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}),
                          metrics_token_required=True, worker_token="w-token")

    anonymous = client.get(worker.url + path)
    wrong = client.get(worker.url + path, headers={"Authorization": "Bearer nope"})
    right = client.get(worker.url + path, headers={"Authorization": "Bearer w-token"})

    assert (anonymous.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert client.get(worker.url + "/v2/health/live").status_code == 200  # probes stay open
    assert client.get(worker.url + "/v2/health/ready").status_code == 200


@pytest.mark.parametrize("path", ["/v2/models/stats", "/v2/models/digits/stats", "/v2/models/digits/versions/1/stats"])
def test_statistics_need_the_worker_token_when_metrics_do(start_worker, client, mlp_v1, path):
    # They tell what /metrics tells: every version's traffic and timings.
    worker = start_worker(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}),
                          metrics_token_required=True, worker_token="w-token")

    anonymous = client.get(worker.url + path)
    right = client.get(worker.url + path, headers={"Authorization": "Bearer w-token"})

    assert (anonymous.status_code, right.status_code) == (401, 200)
    assert "needs the worker token" in anonymous.json()["error"]
    assert client.get(worker.url + "/v2/models/digits/ready").status_code == 200  # a probe stays open
    assert client.get(worker.url + "/v2/models/digits/config").status_code == 200  # as the metadata: perf_analyzer reads it


def test_metrics_token_without_a_worker_token_refuses_to_start(tmp_path, mlp_v1):
    from serving.config import ConfigError
    from serving.worker import Worker
    from serving_testkit import make_config

    with pytest.raises(ConfigError, match="SERVING_WORKER_TOKEN"):
        Worker(make_config(tmp_path, metrics_token_required=True, worker_token=""), None)
