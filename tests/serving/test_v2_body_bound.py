"""A V2 inference body is bounded by what the routed version can take, a /predict body by
what the largest loaded version takes (its model is named inside it), and a large body is
decoded off the event loop.

An attacker's 60 MB body of zeros for a model whose input is [batch, 4] was read whole,
parsed on the event loop (2 s; others stalled meanwhile) and only then refused as a 400,
costing 770 MB; a 60 KB gzip body inflated to the same. A version whose non-batch
dimensions are all fixed takes at most max_batch_size rows of them: 64 bytes an element of
JSON plus 64 KiB, refused (413) from the declared length, as a chunked body passes it, or
as the inflated body does. A body that passes (a model with a dynamic dimension, up to
SERVING_MAX_BODY_BYTES) is decoded in a thread, so other clients are answered meanwhile."""

from __future__ import annotations

import gzip
import socket
import threading
import time

import httpx
import numpy as np
import orjson
import pytest
from onnx import TensorProto, helper
from serving_testkit import SubprocessWorker, route, state, write_model, write_state

from serving import protocol
from serving.engine import TensorSpec
from serving.errors import BadRequest
from serving.protocol import ModelIO

ATK = "/v2/models/atk/infer"
RELU = "/v2/models/relu/infer"
MAX_BATCH_SIZE = 16
ATK_BOUND = MAX_BATCH_SIZE * 4 * 64 + 64 * 1024  # 16 rows of 4 elements, 64 bytes each, plus 64 KiB
ATK_REASON = f"version 3 of 'atk' takes at most {ATK_BOUND} bytes: {MAX_BATCH_SIZE} rows of 4 elements"


def four_wide_relu():
    """input [batch, 4] -> Relu: every non-batch dimension fixed."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "atk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def worker(tmp_path_factory, model_dir, relu_model):
    """atk v3 ([batch, 4]) and relu v1 ([batch, width]) in a worker process of their own
    (its event loop is not this test's), at the default SERVING_MAX_BODY_BYTES (64 MiB)."""
    tmp_path = tmp_path_factory.mktemp("bound")
    atk = write_model(model_dir, "atk", four_wide_relu())
    desired = state(1, {"atk": {"routes": [route(3, 100, *atk)]}, "relu": {"routes": [route(1, 100, *relu_model)]}},
                    max_batch_size=MAX_BATCH_SIZE)
    started = SubprocessWorker(write_state(tmp_path / "state.json", desired), tmp_path).wait_ready()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def fixed_worker(tmp_path_factory, model_dir):
    """Only atk v3 ([batch, 4]): every model it serves has fixed non-batch dimensions."""
    tmp_path = tmp_path_factory.mktemp("bound-fixed")
    atk = write_model(model_dir, "atk", four_wide_relu())
    desired = state(1, {"atk": {"routes": [route(3, 100, *atk)]}}, max_batch_size=MAX_BATCH_SIZE)
    started = SubprocessWorker(write_state(tmp_path / "state.json", desired), tmp_path).wait_ready()
    yield started
    started.stop()


@pytest.fixture
def client():
    with httpx.Client(timeout=30.0) as http:
        yield http


def zeros_body(shape: list[int], count: int, model_input: str = "x") -> bytes:
    """A V2 JSON body claiming `shape` and carrying `count` zeros, as the attack did."""
    head = orjson.dumps({"inputs": [{"name": model_input, "shape": shape, "datatype": "FP32", "data": []}]})
    return head.replace(b'"data":[]', b'"data":[' + b",".join([b"0"] * count) + b"]")


def exchange(port: int, request: bytes, timeout_s: float = 5.0) -> bytes:
    """Send `request` on a fresh connection; the response as far as it came before the server
    closed or went quiet for `timeout_s`."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as connection:
        connection.sendall(request)
        received = b""
        while b"\r\n\r\n" not in received or len(received) < _response_length(received):
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


def _response_length(received: bytes) -> int:
    head, _, _ = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(received) + 1


def refusal_of_a_declared_60_mb(port: int, path: str) -> str:
    """The 413's words for a head declaring 60 MB, no body following: the answer must not wait for one."""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 60000000\r\n\r\n").encode()
    response = exchange(port, head)
    assert response.startswith(b"HTTP/1.1 413 "), response[:200]
    return orjson.loads(response.partition(b"\r\n\r\n")[2])["error"]


def test_a_declared_body_over_the_versions_bound_is_a_413_before_a_byte_of_it_is_sent(worker):
    error = refusal_of_a_declared_60_mb(worker.port, ATK)

    assert error.startswith(f"body of 60000000 bytes is too large: {ATK_REASON}")


def test_a_chunked_body_is_cut_off_at_the_versions_bound(worker, client):
    body = zeros_body([1, 4], 100_000)  # 200 KB: within SERVING_MAX_BODY_BYTES, past the bound

    def chunks():
        for start in range(0, len(body), 8192):
            yield body[start:start + 8192]

    response = client.post(worker.url + ATK, content=chunks())

    assert response.status_code == 413
    assert response.json()["error"].startswith(f"body is too large: {ATK_REASON}")


def test_a_gzip_body_that_inflates_past_the_versions_bound_is_a_413(worker, client):
    content = gzip.compress(zeros_body([1, 4], 1_000_000))  # 2 MB of JSON in a few KB
    assert len(content) < ATK_BOUND

    response = client.post(worker.url + ATK, content=content, headers={"Content-Encoding": "gzip"})

    assert response.status_code == 413
    assert response.json()["error"].startswith(f"body inflated (gzip) is too large: {ATK_REASON}")


def test_a_body_within_the_bound_with_too_many_elements_is_still_the_400_naming_them(worker, client):
    response = client.post(worker.url + ATK, content=zeros_body([1, 4], 100))

    assert response.status_code == 400
    assert response.json()["error"] == "input 'x': data has 100 elements, shape [1, 4] needs 4"


def test_the_largest_request_a_version_takes_is_served_even_pretty_printed(worker, client):
    rows = np.full((MAX_BATCH_SIZE, 4), -1.1754943508222875e-38, np.float64)
    body = orjson.dumps({"id": "r" * 256, "inputs": [{"name": "x", "shape": [MAX_BATCH_SIZE, 4], "datatype": "FP32",
                                                    "data": rows.tolist()}]}, option=orjson.OPT_INDENT_2)

    response = client.post(worker.url + ATK, content=body)

    assert response.status_code == 200
    assert response.json()["outputs"][0]["shape"] == [MAX_BATCH_SIZE, 4]


def test_a_model_with_a_dynamic_dimension_keeps_the_global_limit(worker, client):
    width = ATK_BOUND  # its body is about twice the atk bound
    body = orjson.dumps({"inputs": [{"name": "input", "shape": [1, width], "datatype": "FP32", "data": [0] * width}]})
    assert len(body) > ATK_BOUND

    response = client.post(worker.url + RELU, content=body)

    assert response.status_code == 200
    assert response.json()["outputs"][0]["shape"] == [1, width]


# ---- /predict: the model is named in the body, so the largest version's bound applies --------

PREDICT_REASON = f"no model this worker serves takes more; the largest, {ATK_REASON}"


def test_a_declared_predict_body_past_what_any_loaded_version_takes_is_a_413_before_it_is_sent(fixed_worker):
    error = refusal_of_a_declared_60_mb(fixed_worker.port, "/predict")

    assert error.startswith(f"body of 60000000 bytes is too large: {PREDICT_REASON}")


def test_a_chunked_predict_body_is_cut_off_at_the_largest_versions_bound(fixed_worker, client):
    body = b'{"model_name":"atk","inputs":[' + b"0," * 100_000 + b"0]}"  # 200 KB, past the bound

    def chunks():
        for start in range(0, len(body), 8192):
            yield body[start:start + 8192]

    response = client.post(fixed_worker.url + "/predict", content=chunks())

    assert response.status_code == 413
    assert response.json()["error"].startswith(f"body is too large: {PREDICT_REASON}")


def test_the_largest_predict_request_a_version_takes_is_served(fixed_worker, client):
    rows = np.full((MAX_BATCH_SIZE, 4), -1.1754943508222875e-38, np.float64)
    body = orjson.dumps({"model_name": "atk", "inputs": rows.tolist()}, option=orjson.OPT_INDENT_2)

    response = client.post(fixed_worker.url + "/predict", content=body)

    assert response.status_code == 200
    assert np.asarray(response.json()["outputs"]["y"]).shape == (MAX_BATCH_SIZE, 4)


def test_a_predict_body_keeps_the_global_limit_where_a_loaded_model_has_a_dynamic_dimension(worker, client):
    width = ATK_BOUND  # about twice the atk bound: relu takes it
    body = orjson.dumps({"model_name": "relu", "inputs": [[0] * width]})
    assert len(body) > ATK_BOUND

    response = client.post(worker.url + "/predict", content=body)

    assert response.status_code == 200


# ---- a large body is decoded off the event loop ---------------------------------------------

BIG_ELEMENTS = 10_000_000  # 20 MB of JSON zeros: the attack's body, at a third of its size


def big_request(path: str) -> bytes:
    """A body for relu (dynamic width: no bound but the global one) that is parsed and
    converted whole before it is refused (400), so its answer comes when its decode ends."""
    if path == "/predict":
        body = b'{"model_name":"relu","inputs":[' + b"0," * BIG_ELEMENTS + b'"x"]}'  # the last value is wrong
    else:  # its shape fits its data, so the whole list is converted before the last value refuses it
        body = zeros_body([1, BIG_ELEMENTS + 1], BIG_ELEMENTS, model_input="input").replace(b"0]}]}", b'0,"x"]}]}')
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def answered_after(port: int, request: bytes, sent: threading.Event) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
        connection.sendall(request)
        sent.set()
        received = b""
        while len(received) < _response_length(received):
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
        return received, time.monotonic()


@pytest.mark.parametrize("path", [RELU, "/predict"])
def test_other_clients_are_answered_while_a_large_body_is_decoded(worker, client, path):
    request = big_request(path)
    solo_started = time.monotonic()
    alone, _ = answered_after(worker.port, request, threading.Event())
    decode_s = time.monotonic() - solo_started  # about the time the worker takes to decode it
    assert alone.startswith(b"HTTP/1.1 400 ")

    sent, result = threading.Event(), {}
    big = threading.Thread(target=lambda: result.update(big=answered_after(worker.port, request, sent)))
    big.start()
    assert sent.wait(30)
    time.sleep(decode_s * 0.3)  # the body is in; its decode is under way
    small_started = time.monotonic()
    small = client.post(worker.url + RELU, json={"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32",
                                                             "data": [1, -1]}]})
    small_done = time.monotonic()
    big.join(60)
    big_response, big_done = result["big"]

    assert small.status_code == 200
    assert big_response.startswith(b"HTTP/1.1 400 ")
    assert small_done < big_done, (f"the small request took {small_done - small_started:.3f} s and was answered after "
                                   f"the large one (decoded in about {decode_s:.3f} s)")


# ---- long data lists are checked and converted a slice at a time, with the same answers ------

def relu_io() -> ModelIO:
    spec = TensorSpec("input", "FP32", (None, None))
    return ModelIO((spec,), (spec,), True, 16_000_000)


@pytest.mark.parametrize(("data", "error"), [
    pytest.param([[0.5, 0.5]] * protocol.SLICE_ITEMS + [[0.5, 0.5, 0.5]] * 10, "data is not a rectangular array of FP32 values",
                 id="longer rows far in"),
    pytest.param([0.5] * 300_000 + [1e300], "a value is out of range for FP32", id="out of range far in"),
    pytest.param([0] * 300_000 + [None], "FP32 data must hold numbers, found null", id="null far in"),
])
def test_a_long_data_list_is_refused_for_what_is_wrong_far_into_it(data, error):
    elements = sum(len(value) if isinstance(value, list) else 1 for value in data)  # as many as the shape: not refused for its length
    body = orjson.dumps({"inputs": [{"name": "input", "shape": [1, elements], "datatype": "FP32", "data": data}]})

    with pytest.raises(BadRequest) as refused:
        protocol.decode_v2(body, None, relu_io())

    assert refused.value.message == f"input 'input': {error}"


def test_a_long_data_list_decodes_to_the_same_array():
    rows = np.random.default_rng(3).standard_normal((300_000, 2)).astype(np.float32)
    body = orjson.dumps({"inputs": [{"name": "input", "shape": [300_000, 2], "datatype": "FP32", "data": rows.tolist()}]})

    decoded = protocol.decode_v2(body, None, relu_io())

    np.testing.assert_array_equal(decoded.tensors[0], rows)


@pytest.mark.parametrize("path", [ATK, "/v2/models/nope/infer"])
def test_a_chunked_body_sent_with_connection_close_still_reads_its_early_answer(worker, path):
    # Answered before its body was read, then closed with the rest unread: a reset, and the
    # client's recv failed before the answer (the same body with Content-Length got its 413).
    part = b" " * 65536
    request = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
               "Transfer-Encoding: chunked\r\n\r\n").encode() + (b"%x\r\n" % len(part) + part + b"\r\n") * 16 + b"0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", worker.port), timeout=10) as connection:
        connection.sendall(request)  # 1 MiB, past the version's bound, written at once as a client does
        received = b""
        while chunk := connection.recv(65536):
            received += chunk

    assert received.startswith((b"HTTP/1.1 413 ", b"HTTP/1.1 404 ")), received[:200]
