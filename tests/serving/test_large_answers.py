"""Large JSON answers are encoded off the event loop, as large bodies are decoded: a 159 MB
answer encoded on the loop stalled every other request for 1.3 s. Whether an answer is
large is estimated from its outputs' element counts before encoding, so small answers
take no thread hop; a large one is written a slice at a time, the loop running between."""

from __future__ import annotations

import threading

import numpy as np
import orjson
import pytest
from serving_testkit import counts_up_to, relu_any_width, route, state, write_model

from serving import protocol
from serving.dataplane import DECODE_OFF_LOOP_BYTES, encodes_off_loop
from serving.engine import TensorSpec
from serving.protocol import Decoded, ModelIO

LARGE = 300_000  # elements per output: past protocol.SLICE_ITEMS, so written in slices too
CLASSES = ModelIO((TensorSpec("input", "FP32", (None, 64)),), (TensorSpec("probabilities", "FP32", (None, 10)),), True, 10**8)


@pytest.fixture(scope="module")
def counts_model(model_dir):
    return write_model(model_dir, "counts_up_to", counts_up_to())


@pytest.fixture
def counts_worker(start_worker, counts_model):
    """Not batchable: each request's count decides its own answer's length."""
    return start_worker(state(1, {"counts": {"routes": [route(1, 100, *counts_model, batchable=False)]}}))


def test_a_small_answer_is_encoded_on_the_loop():
    outputs = (np.zeros((16, 10), np.float32),)

    assert not encodes_off_loop(protocol.v2_answer_bytes(Decoded((), 16, CLASSES.json_outputs), outputs, CLASSES))
    assert not encodes_off_loop(protocol.predict_answer_bytes(outputs))


def test_an_answer_estimated_past_the_decode_threshold_is_encoded_off_the_loop():
    outputs = (np.zeros((DECODE_OFF_LOOP_BYTES // 10, 10), np.float32),)

    assert encodes_off_loop(protocol.v2_answer_bytes(Decoded((), len(outputs[0]), CLASSES.json_outputs), outputs, CLASSES))
    assert encodes_off_loop(protocol.predict_answer_bytes(outputs))


def test_a_binary_output_is_estimated_at_its_bytes():
    outputs = (np.zeros((1000, 10), np.float32),)
    as_binary = Decoded((), 1000, CLASSES.default_outputs[True])

    assert protocol.v2_answer_bytes(as_binary, outputs, CLASSES) == outputs[0].nbytes


@pytest.mark.parametrize("count", [10, LARGE], ids=["small", "large"])
def test_only_a_large_answer_is_encoded_outside_the_event_loops_thread(counts_worker, client, monkeypatch, count):
    threads = []
    encode_v2 = protocol.encode_v2

    def recorded(*args):
        threads.append(threading.current_thread())
        return encode_v2(*args)

    monkeypatch.setattr(protocol, "encode_v2", recorded)

    answer = client.post(counts_worker.url + "/v2/models/counts/infer", json=counts_request(count))

    assert answer.status_code == 200
    assert (threads[0] is counts_worker.thread) == (count == 10)


def counts_request(count: int) -> dict:
    return {"inputs": [{"name": "count", "shape": [1], "datatype": "INT64", "data": [count]}]}


def test_a_large_v2_answer_is_whole_and_exact(counts_worker, client):
    answer = client.post(counts_worker.url + "/v2/models/counts/infer", json=counts_request(LARGE))

    values, logs = answer.json()["outputs"]
    assert (answer.status_code, values["shape"], logs["shape"]) == (200, [LARGE], [LARGE])
    assert np.array_equal(np.array(values["data"], np.float32), np.arange(LARGE, dtype=np.float32))
    assert logs["data"][0] == "-Infinity"  # JSON has no infinity: the word, in a sliced answer too
    np.testing.assert_allclose(np.array(logs["data"][1:], np.float32), np.log(np.arange(1, LARGE, dtype=np.float32)), rtol=1e-6)


def test_a_large_predict_answer_is_whole_and_exact(counts_worker, client):
    answer = client.post(counts_worker.url + "/predict", json={"model_name": "counts", "inputs": {"count": [LARGE]}})

    outputs = answer.json()["outputs"]
    assert answer.status_code == 200
    assert np.array_equal(np.array(outputs["values"], np.float32), np.arange(LARGE, dtype=np.float32))
    assert outputs["logs"][0] == "-Infinity"
    np.testing.assert_allclose(np.array(outputs["logs"][1:], np.float32), np.log(np.arange(1, LARGE, dtype=np.float32)), rtol=1e-6)


@pytest.fixture
def log_worker(start_worker, model_dir):
    """Log of any width: -1 in, NaN out."""
    return start_worker(state(1, {"log": {"routes": [route(1, 100, *write_model(model_dir, "log_any_width", relu_any_width("Log")), batchable=False)]}}),
                        max_body_bytes=16 * 1024 * 1024, max_elements=1_000_000)


@pytest.mark.parametrize("shape", [(300, 1000), (2, 140_000)], ids=["rows-smaller-than-a-slice", "rows-larger-than-a-slice"])
def test_a_large_two_dimensional_predict_answer_keeps_every_row_and_a_nan_in_a_later_slice(log_worker, client, shape):
    rows = np.arange(1, np.prod(shape) + 1, dtype=np.float32).reshape(shape)
    rows[-1, -1] = -1  # its log is NaN, in the last slice, not the first

    answer = client.post(log_worker.url + "/predict", content=orjson.dumps({"model_name": "log", "inputs": rows.tolist()}),
                         headers={"content-type": "application/json"})

    assert answer.status_code == 200, answer.text[:300]
    output = answer.json()["outputs"]["output"]
    assert (len(output), {len(row) for row in output}) == (shape[0], {shape[1]})
    assert output[-1][-1] == "NaN"
    output[-1][-1] = float("nan")
    with np.errstate(invalid="ignore"):
        expected = np.log(rows)
    np.testing.assert_allclose(np.array(output, np.float32), expected, rtol=1e-6)


@pytest.mark.parametrize("path, body", [
    ("/v2/models/counts/infer", {"inputs": [{"name": "count", "shape": [1], "datatype": "INT64", "data": [2_000_000]}]}),
    ("/predict", {"model_name": "counts", "inputs": [2_000_000]}),
], ids=["v2", "predict"])
def test_an_answer_larger_than_the_unsent_budget_is_a_400_naming_it_not_a_200_cut_short(start_worker, counts_model, client, path, body):
    """The answer is written to the transport whole: its writes paused at once holding all
    of it, so an answer past SERVING_MAX_UNSENT_BYTES (256 MiB: a 60-byte request for 3e7
    values) had its connection cut as a client not reading, a 200 whose body ended after
    about 4 MB. Sent a slice at a time instead, it was held outside that bound for as long
    as its client read a little every few seconds. It is refused whole, naming the bound."""
    worker = start_worker(state(1, {"counts": {"routes": [route(1, 100, *counts_model, batchable=False)]}}),
                          max_unsent_bytes=4 * 1024 * 1024)

    answer = client.post(worker.url + path, json=body, timeout=30)

    assert answer.status_code == 400
    assert answer.headers["x-model-version"] == "1"
    error = answer.json()["error"]
    assert error.startswith("the answer is ") and "more than this worker holds for a client (4194304 bytes, SERVING_MAX_UNSENT_BYTES)" in error


@pytest.mark.parametrize("path, body", [
    ("/v2/models/counts/infer", {"inputs": [{"name": "count", "shape": [1], "datatype": "INT64", "data": [100_000]}]}),
    ("/predict", {"model_name": "counts", "inputs": [100_000]}),
], ids=["v2", "predict"])
def test_an_answer_within_the_unsent_budget_is_whole(start_worker, counts_model, client, path, body):
    worker = start_worker(state(1, {"counts": {"routes": [route(1, 100, *counts_model, batchable=False)]}}),
                          max_unsent_bytes=4 * 1024 * 1024)

    answer = client.post(worker.url + path, json=body, timeout=30)

    assert answer.status_code == 200
    values = answer.json()["outputs"][0]["data"] if path != "/predict" else answer.json()["outputs"]["values"]
    assert len(values) == 100_000 and values[-1] == 99_999.0


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/counts"])
def test_an_answer_that_is_no_inference_is_never_refused_for_its_size(start_worker, counts_model, client, path):
    """The bound is on inference answers (ask for fewer rows): a health probe or metadata
    answer a few bytes over a small SERVING_MAX_UNSENT_BYTES was a 400, so with 8 the
    worker never read as ready, though such an answer never waits on a client."""
    worker = start_worker(state(1, {"counts": {"routes": [route(1, 100, *counts_model, batchable=False)]}}), max_unsent_bytes=8)

    assert client.get(worker.url + path, timeout=30).status_code == 200


def test_an_answer_within_the_write_high_water_mark_is_never_refused_for_its_size(start_worker, counts_model, client):
    """Alone it never pauses its connection's writes, so it is never cut: refused under a
    small bound, it was a 400 the bound was not there to prevent."""
    worker = start_worker(state(1, {"counts": {"routes": [route(1, 100, *counts_model, batchable=False)]}}), max_unsent_bytes=8)

    answer = client.post(worker.url + "/v2/models/counts/infer", json={"inputs": [{"name": "count", "shape": [1], "datatype": "INT64", "data": [100]}]})

    assert answer.status_code == 200
    assert 8 < len(answer.content) < 64 * 1024


@pytest.mark.parametrize("path, body, encoder", [
    ("/v2/models/counts/infer", {"inputs": [{"name": "count", "shape": [1], "datatype": "INT64", "data": [2_000_000]}]}, "encode_v2"),
    ("/predict", {"model_name": "counts", "inputs": [2_000_000]}, "encode_predict"),
], ids=["v2", "predict"])
def test_an_answer_certainly_past_the_unsent_budget_is_refused_before_it_is_encoded(start_worker, counts_model, client, monkeypatch,
                                                                                     path, body, encoder):
    """An attacker (8 Dec) sent a 132 KB request to a model whose output grows with the
    square of an input's width: its 1.44 GB JSON answer was encoded whole (12-20 s, the
    worker from 196 MB to 4.9 GB, another model's request held 7.5 s) only to be refused
    for its size. Every JSON element takes at least two bytes (a digit and a comma), so an
    answer past the bound by that count alone is refused before a byte of it is built."""
    worker = start_worker(state(1, {"counts": {"routes": [route(1, 100, *counts_model, batchable=False)]}}),
                          max_unsent_bytes=4 * 1024 * 1024)
    encoded = []
    real = getattr(protocol, encoder)
    monkeypatch.setattr(protocol, encoder, lambda *args: encoded.append(args) or real(*args))

    answer = client.post(worker.url + path, json=body, timeout=30)

    assert answer.status_code == 400
    assert answer.headers["x-model-version"] == "1"
    assert "more than this worker holds for a client (4194304 bytes, SERVING_MAX_UNSENT_BYTES)" in answer.json()["error"]
    assert encoded == []


@pytest.mark.parametrize("datatype, array", [
    ("FP32", np.zeros((3, 5), np.float32)),
    ("FP32", np.full((1,), np.nan, np.float32)),
    ("INT64", np.arange(7, dtype=np.int64)),
    ("BOOL", np.zeros((4,), np.bool_)),
    ("BYTES", np.array(["", "", ""], dtype=object)),
], ids=["fp32", "nan", "int64", "bool", "bytes"])
@pytest.mark.parametrize("as_binary", [False, True], ids=["json", "binary"])
def test_the_least_size_of_an_answer_is_never_more_than_its_encoding(datatype, array, as_binary):
    io = ModelIO((TensorSpec("x", "FP32", (None,)),), (TensorSpec("y", datatype, tuple(None for _ in array.shape)),), False, 10**8)
    decoded = Decoded((), 1, io.default_outputs[as_binary])
    body, json_length = protocol.encode_v2("m", 1, decoded, (array,), io)
    data_bytes = len(body) - json_length if as_binary else len(orjson.dumps(orjson.loads(body)["outputs"][0]["data"]))

    assert 0 < protocol.v2_answer_least_bytes(decoded, (array,), io) <= data_bytes
