"""KServe V2 and /predict codecs: what is accepted, and the 400 each mistake gets."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from serving.engine import TensorSpec
from serving.errors import BadRequest
from serving.protocol import ModelIO, decode_predict, decode_v2, encode_v2

IO = ModelIO(
    inputs=(TensorSpec("input", "FP32", (None, 4)),),
    outputs=(TensorSpec("probabilities", "FP32", (None, 2)), TensorSpec("logits", "FP32", (None, 2))),
    is_batchable=True,
    max_elements=1000,
)


def body(**tensor) -> bytes:
    base = {"name": "input", "shape": [2, 4], "datatype": "FP32", "data": list(range(8))}
    return orjson.dumps({"inputs": [{**base, **tensor}]})


def test_flat_json_data_becomes_a_batch_in_row_major_order():
    decoded = decode_v2(body(), None, IO)

    assert decoded.rows == 2
    assert decoded.tensors[0].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert decoded.tensors[0].dtype == np.float32


def test_nested_json_data_is_accepted():
    decoded = decode_v2(body(data=[[0, 1, 2, 3], [4, 5, 6, 7]]), None, IO)

    assert decoded.tensors[0].shape == (2, 4)


def test_binary_tensor_data_is_read_after_the_json_header():
    array = np.arange(8, dtype=np.float32).reshape(2, 4)
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [2, 4], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 32}}]})

    decoded = decode_v2(header + array.tobytes(), len(header), IO)

    assert np.array_equal(decoded.tensors[0], array)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"inputs": []}', "'inputs' must be a non-empty list"),
        (body(name="pixels"), "input 'pixels': the model has no such input"),
        (body(datatype="INT64"), "input 'input': datatype must be FP32"),
        (body(shape=[2, 5]), "input 'input': dimension 1 must be 4, got 5"),
        (body(shape=[8]), "input 'input': expected rank 2"),
        (body(shape=[0, 4], data=[]), "input 'input': dimension 0 must be at least 1"),
        (body(shape=[2, 4], data=[1, 2, 3]), "input 'input': data has 3 elements, shape [2, 4] needs 8"),
        (body(data=["a"] * 8), "input 'input': data is not a rectangular array of FP32"),
        (body(data=[[1, 2], [3]]), "input 'input': data is not a rectangular array"),
        (body(data="0123"), "input 'input': data must be a list"),
        (body(shape=["2", 4]), "input 'input': shape must be a list of integers"),
        (body(shape=[300, 4], data=[0] * 1200), "input 'input': 1200 elements exceed the limit of 1000"),
    ],
)
def test_invalid_v2_request_is_refused_naming_the_problem(raw, message):
    with pytest.raises(BadRequest, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_v2(raw, None, IO)


def test_binary_size_that_does_not_match_the_shape_is_refused():
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [2, 4], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 16}}]})

    with pytest.raises(BadRequest, match="input 'input': binary_data_size 16"):
        decode_v2(header + bytes(16), len(header), IO)


def test_header_length_beyond_the_body_is_refused():
    with pytest.raises(BadRequest, match="Inference-Header-Content-Length"):
        decode_v2(body(), 10_000, IO)


def test_missing_input_is_named():
    io = ModelIO((IO.inputs[0], TensorSpec("mask", "BOOL", (None, 4))), IO.outputs, True, 1000)

    with pytest.raises(BadRequest, match="input 'mask': missing"):
        decode_v2(body(), None, io)


def test_unknown_requested_output_is_refused():
    raw = orjson.dumps({**orjson.loads(body()), "outputs": [{"name": "nope"}]})

    with pytest.raises(BadRequest, match="output 'nope'"):
        decode_v2(raw, None, IO)


def test_timeout_parameter_is_read_in_microseconds():
    raw = orjson.dumps({**orjson.loads(body()), "parameters": {"timeout": 250_000}})

    assert decode_v2(raw, None, IO).timeout_s == 0.25


def test_response_sends_requested_outputs_in_binary_when_asked():
    raw = orjson.dumps({**orjson.loads(body()), "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]})
    decoded = decode_v2(raw, None, IO)
    outputs = [np.zeros((2, 2), np.float32), np.arange(4, dtype=np.float32).reshape(2, 2)]

    payload, json_length = encode_v2("digits", 3, decoded, outputs, IO)

    header = orjson.loads(payload[:json_length])
    assert header["model_version"] == "3"
    assert header["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [2, 2],
                                  "parameters": {"binary_data_size": 16}}]
    assert np.frombuffer(payload[json_length:], np.float32).tolist() == [0, 1, 2, 3]


def test_response_in_json_has_flat_data_and_the_request_id():
    raw = orjson.dumps({**orjson.loads(body()), "id": "abc"})
    decoded = decode_v2(raw, None, IO)
    outputs = [np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32)]

    payload, json_length = encode_v2("digits", 1, decoded, outputs, IO)

    document = orjson.loads(payload)
    assert json_length is None
    assert document["id"] == "abc"
    assert document["outputs"][0] == {"name": "probabilities", "datatype": "FP32", "shape": [2, 2], "data": [1, 1, 1, 1]}


def test_predict_accepts_one_row_and_remembers_it():
    decoded = decode_predict({"inputs": [0, 1, 2, 3]}, IO)

    assert decoded.is_single_row and decoded.tensors[0].shape == (1, 4)


def test_predict_accepts_a_list_of_rows_or_a_dict_by_input_name():
    assert decode_predict({"inputs": [[0, 1, 2, 3], [4, 5, 6, 7]]}, IO).rows == 2
    assert decode_predict({"inputs": {"input": [[0, 1, 2, 3]]}}, IO).rows == 1


def test_predict_row_of_the_wrong_width_is_refused():
    with pytest.raises(BadRequest, match="input 'input': dimension 1 must be 4, got 3"):
        decode_predict({"inputs": [0, 1, 2]}, IO)
