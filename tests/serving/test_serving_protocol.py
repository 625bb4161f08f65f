"""KServe V2 and /predict codecs: what is accepted, and the 400 each mistake gets."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from serving.engine import TensorSpec
from serving.errors import BadRequest
from serving.protocol import ModelIO, decode_predict, decode_v2, encode_predict, encode_v2

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
        (body(data=["a"] * 8), "input 'input': FP32 data must hold numbers, found a string"),
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


def io_of(datatype: str) -> ModelIO:
    return ModelIO((TensorSpec("input", datatype, (None, 2)),), IO.outputs, True, 1000)


def v2_of(datatype: str, data) -> bytes:
    return orjson.dumps({"inputs": [{"name": "input", "shape": [1, 2], "datatype": datatype, "data": data}]})


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("FP32", ["0.5", 1.0], "input 'input': FP32 data must hold numbers, found a string"),
        ("FP32", ["NaN", 1.0], "input 'input': FP32 data must hold numbers, found a string"),
        ("FP32", [None, 1.0], "input 'input': FP32 data must hold numbers, found null"),
        ("FP32", [True, 1.0], "input 'input': FP32 data must hold numbers, found a boolean"),
        ("FP32", [[True, False]], "input 'input': FP32 data must hold numbers, found a boolean"),
        ("FP32", [{"a": 1}, 1.0], "input 'input': FP32 data must hold numbers, found an object"),
        ("FP32", [1e39, 1.0], "input 'input': a value is out of range for FP32"),
        ("FP16", [70000, 1.0], "input 'input': a value is out of range for FP16"),
        ("INT64", [0.5, 1], "input 'input': INT64 data must hold integers, found a non-integer number"),
        ("INT64", [True, 1], "input 'input': INT64 data must hold integers, found a boolean"),
        ("INT8", [300, 1], "input 'input': a value is out of range for INT8"),
        ("UINT8", [-1, 1], "input 'input': a value is out of range for UINT8"),
        ("INT64", [2**63, 1], "input 'input': a value is out of range for INT64"),
        ("BOOL", [1, 0], "input 'input': BOOL data must hold booleans (true/false), found an integer"),
        ("BOOL", ["true", False], "input 'input': BOOL data must hold booleans (true/false), found a string"),
        ("FP32", [[1.0], 2.0], "input 'input': data is not a rectangular array of FP32 values"),
    ],
)
def test_json_data_that_is_not_of_the_declared_type_is_refused_naming_the_input(datatype, data, message):
    with pytest.raises(BadRequest) as refused:
        decode_v2(v2_of(datatype, data), None, io_of(datatype))

    assert refused.value.message == message


@pytest.mark.parametrize(("datatype", "number"), [("INT64", "-9223372036854775809"), ("INT64", "9223372036854775808"),
                                                  ("UINT64", "18446744073709551616")])
def test_an_integer_past_64_bits_is_out_of_range_not_a_non_integer(datatype, number):
    raw = b'{"inputs": [{"name": "input", "shape": [1, 2], "datatype": "%s", "data": [%s, 1]}]}' % (datatype.encode(), number.encode())

    with pytest.raises(BadRequest) as refused:
        decode_v2(raw, None, io_of(datatype))

    assert refused.value.message == f"input 'input': a value is out of range for {datatype}"


def test_an_input_with_both_data_and_binary_data_is_refused():
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [2, 4], "datatype": "FP32", "data": list(range(8)),
                                       "parameters": {"binary_data_size": 32}}]})

    with pytest.raises(BadRequest, match="input 'input': give its values as 'data' or as binary data"):
        decode_v2(header + bytes(32), len(header), IO)


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [("FP32", [1, 0.5], [[1.0, 0.5]]), ("FP64", [[-3, 2.5]], [[-3.0, 2.5]]), ("INT8", [-128, 127], [[-128, 127]]),
     ("UINT8", [0, 255], [[0, 255]]), ("INT64", [2**62, -1], [[2**62, -1]]), ("BOOL", [True, False], [[True, False]])],
)
def test_json_data_of_the_declared_type_is_decoded_exactly(datatype, data, expected):
    decoded = decode_v2(v2_of(datatype, data), None, io_of(datatype))

    assert decoded.tensors[0].dtype == io_of(datatype).inputs[0].dtype
    assert decoded.tensors[0].tolist() == expected


def test_predict_refuses_strings_in_float_rows_naming_the_input():
    with pytest.raises(BadRequest) as refused:
        decode_predict({"inputs": [[0, 1, "2", 3]]}, IO)

    assert refused.value.message == "input 'input': FP32 data must hold numbers, found a string"


def test_output_requested_twice_is_refused_without_reading_the_rest():
    requested = [{"name": "probabilities"}] * 5000
    raw = orjson.dumps({**orjson.loads(body()), "outputs": requested})

    with pytest.raises(BadRequest) as refused:
        decode_v2(raw, None, IO)

    assert refused.value.message == "output 'probabilities': requested more than once"


def test_unknown_output_name_is_refused_with_a_short_prefix_of_it():
    raw = orjson.dumps({**orjson.loads(body()), "outputs": [{"name": "x" * 10_000}]})

    with pytest.raises(BadRequest) as refused:
        decode_v2(raw, None, IO)

    assert refused.value.message.startswith("output 'xxxx")
    assert refused.value.message.endswith("…: the model has no such output")
    assert len(refused.value.message) < 130


@pytest.mark.parametrize(("request_part", "message"), [
    ({"outputs": [{"name": "logits", "parameters": {"binary_data": "false"}}]}, "output 'logits': binary_data must be true or false, got 'false'"),
    ({"outputs": [{"name": "logits", "parameters": {"binary_data": 1}}]}, "output 'logits': binary_data must be true or false, got 1"),
    ({"parameters": {"binary_data_output": "yes"}}, "parameters: binary_data_output must be true or false, got 'yes'"),
], ids=["a string", "a number", "the request's default"])
def test_a_binary_data_flag_that_is_not_a_boolean_is_refused_naming_it(request_part, message):
    raw = orjson.dumps({**orjson.loads(body()), **request_part})

    with pytest.raises(BadRequest) as refused:
        decode_v2(raw, None, IO)

    assert refused.value.message == message


@pytest.mark.parametrize(("entry", "got"), [({}, "no name"), ({"name": 7}, "name 7"), ("logits", "a str")])
def test_an_output_entry_without_a_name_is_refused_saying_the_name_is_missing(entry, got):
    raw = orjson.dumps({**orjson.loads(body()), "outputs": [entry]})

    with pytest.raises(BadRequest) as refused:
        decode_v2(raw, None, IO)

    assert refused.value.message == f"each entry of 'outputs' needs a 'name', a string naming one of the model's outputs; got {got}"


def test_every_output_once_in_any_order_is_accepted():
    raw = orjson.dumps({**orjson.loads(body()), "outputs": [{"name": "logits"}, {"name": "probabilities"}]})

    assert decode_v2(raw, None, IO).outputs == ((1, False), (0, False))


def test_long_client_strings_are_echoed_only_as_a_short_prefix():
    raw = orjson.dumps({"inputs": [{"name": "n" * 5000, "shape": [1], "datatype": "FP32", "data": [1]}]})
    datatype = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "D" * 5000, "data": [1]}]})

    for request in (raw, datatype):
        with pytest.raises(BadRequest) as refused:
            decode_v2(request, None, IO)
        assert len(refused.value.message) < 200


def test_non_finite_outputs_are_written_as_words_and_read_back_by_numpy():
    decoded = decode_v2(body(), None, IO)
    outputs = [np.array([[np.nan, 1.5], [np.inf, -np.inf]], np.float32), np.zeros((2, 2), np.float32)]

    payload, _ = encode_v2("digits", 1, decoded, outputs, IO)

    data = orjson.loads(payload)["outputs"][0]["data"]  # strict JSON: orjson reads it
    assert data == ["NaN", 1.5, "Infinity", "-Infinity"]
    read_back = np.array(data, dtype=np.float32)
    assert np.isnan(read_back[0]) and read_back[1:].tolist() == [1.5, np.inf, -np.inf]


def test_non_finite_outputs_in_predict_answers_are_words_in_their_rows():
    decoded = decode_predict({"inputs": [[0, 1, 2, 3], [4, 5, 6, 7]]}, IO)
    outputs = [np.array([[1.0, np.nan], [-np.inf, 2.0]], np.float32), np.zeros((2, 2), np.float32)]

    document = orjson.loads(encode_predict("r-1", "digits", 1, decoded, outputs, IO, 1.0))

    assert document["outputs"]["probabilities"] == [[1.0, "NaN"], ["-Infinity", 2.0]]
    assert document["outputs"]["logits"] == [[0.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("raw", [b"\x02\x01", b"\x00\xff"])
def test_bool_binary_data_other_than_bytes_0_and_1_is_refused(raw):
    # NumPy reads any byte as a bool: 2 went to the model as a true that Not left true,
    # and a Cast of it answered 2 (JSON's true answered 1).
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "BOOL",
                                       "parameters": {"binary_data_size": 2}}]})

    with pytest.raises(BadRequest) as refused:
        decode_v2(header + raw, len(header), io_of("BOOL"))

    assert refused.value.message == "input 'input': BOOL binary data must be bytes 0 or 1"


def test_bool_binary_data_of_bytes_0_and_1_is_read_as_booleans():
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "BOOL",
                                       "parameters": {"binary_data_size": 2}}]})

    decoded = decode_v2(header + b"\x01\x00", len(header), io_of("BOOL"))

    assert decoded.tensors[0].tolist() == [[True, False]]


@pytest.mark.parametrize(("data", "many"), [(list(range(900)), "900"), ([[0.5, 0.5]] * 900, "over 2"),
                                            ([[0.5] * 900], "over 2")])  # one level deeper: the top level counts 1
def test_data_longer_than_its_shape_is_refused_before_it_is_converted(data, many):
    with pytest.raises(BadRequest) as refused:
        decode_v2(v2_of("FP32", data), None, io_of("FP32"))

    assert refused.value.message == f"input 'input': data has {many} elements, shape [1, 2] needs 2"


@pytest.mark.parametrize("where", ["input", "output"])
def test_a_shared_memory_region_is_refused_as_unsupported_not_misread(where):
    """Triton's shared-memory extension: an input naming a region has no data, and was
    refused as "data must be a list"; an output naming one was answered in the body as if
    it had not been asked for."""
    region = {"shared_memory_region": "input_data", "shared_memory_byte_size": 32}
    tensor = {"name": "input", "shape": [2, 4], "datatype": "FP32", "parameters": region}
    document = {"inputs": [tensor]} if where == "input" else {
        "inputs": [{**tensor, "parameters": {}, "data": list(range(8))}], "outputs": [{"name": "logits", "parameters": region}]}

    with pytest.raises(BadRequest) as refused:
        decode_v2(orjson.dumps(document), None, IO)

    shown = "input 'input'" if where == "input" else "output 'logits'"
    assert refused.value.message == (f"{shown}: parameter \"shared_memory_region\" is not supported (this server does not "
                                     "implement the shared-memory extension: send the tensor in the body)")


@pytest.mark.parametrize("inputs", [[], {"input": []}])
def test_predict_with_no_rows_is_refused_saying_so(inputs):
    with pytest.raises(BadRequest) as refused:
        decode_predict({"inputs": inputs}, IO)

    assert refused.value.message == "input 'input': no rows (an empty list)"
