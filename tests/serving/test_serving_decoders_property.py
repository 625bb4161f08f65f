"""Property tests of the request decoders: whatever arrives, the answer is a 4xx naming a
problem or a correctly decoded request; never another exception, never a hang.

The decoders are pure functions (`decode_v2` for JSON and the binary tensor extension,
`predict_target` + `decode_predict` for /predict), so hypothesis drives them directly,
then a few hundred requests go through a real worker to check that no status is a 5xx.
"""

from __future__ import annotations

import json
import math
import time
from datetime import timedelta

import httpx
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from serving.engine import TensorSpec
from serving.errors import ServingError
from serving.protocol import Decoded, ModelIO, decode_predict, decode_v2, load_object, predict_target
from serving_testkit import ThreadedWorker, make_config, route, state, write_state

IO = ModelIO(
    inputs=(TensorSpec("x", "FP32", (None, 3)), TensorSpec("k", "INT8", (None, 3))),
    outputs=(TensorSpec("y", "FP32", (None, 2)), TensorSpec("z", "INT64", (None,))),
    is_batchable=True,
    max_elements=64,
)
ONE_INPUT = ModelIO((TensorSpec("flag", "BOOL", (None, 2)),), IO.outputs[:1], True, 64)
def dumps(document) -> bytes:
    """JSON text the way any client may write it (integers beyond 64 bits included)."""
    return json.dumps(document).encode()


ALLOWED = {"f": (int, float), "i": (int,), "u": (int,), "b": (bool,)}
BOUNDED = settings(max_examples=200, deadline=timedelta(milliseconds=500),
                   suppress_health_check=[HealthCheck.too_slow])


def decodes_or_refuses(decode, *args) -> Decoded | None:
    """The decoder's result, or None for a refusal, which must be a client error (4xx)."""
    try:
        return decode(*args)
    except ServingError as refusal:
        assert 400 <= refusal.status < 500, refusal
        assert refusal.message and len(refusal.message) <= 401
        return None


def flat(data) -> list:
    return [leaf for item in data for leaf in flat(item)] if isinstance(data, list) else [data]


def assert_decoded_as_sent(decoded: Decoded, io: ModelIO, items_by_name: dict) -> None:
    """A successful decode holds exactly what the client sent, with the declared types."""
    assert len(decoded.tensors) == len(io.inputs)
    for spec, tensor in zip(io.inputs, decoded.tensors):
        assert tensor.dtype == spec.dtype
        assert len(tensor.shape) == len(spec.shape)
        assert all(want is None or got == want for got, want in zip(tensor.shape, spec.shape))
        assert tensor.size <= io.max_elements
        values = flat(items_by_name[spec.name])
        assert all(type(value) in ALLOWED[spec.dtype.kind] for value in values)
        assert tensor.ravel().tolist() == np.array(values, dtype=spec.dtype).tolist()
    assert decoded.rows == decoded.tensors[0].shape[0]
    assert len({index for index, _ in decoded.outputs}) == len(decoded.outputs)


# ---- arbitrary input ------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=40,
)


@BOUNDED
@given(body=st.binary(max_size=2048), header_length=st.none() | st.integers(-5, 2100))
def test_any_bytes_are_a_4xx_or_a_request(body, header_length):
    decodes_or_refuses(decode_v2, body, header_length, IO)


@BOUNDED
@given(document=json_values)
def test_any_json_value_is_a_4xx_or_a_request(document):
    body = dumps(document)

    decodes_or_refuses(decode_v2, body, None, IO)
    if isinstance(document, dict):
        decodes_or_refuses(lambda: (predict_target(document), decode_predict(document, IO)))
        decodes_or_refuses(decode_predict, document, ONE_INPUT)


# ---- structured but possibly wrong ----------------------------------------------------

names = st.sampled_from(["x", "k", "flag", "", "X", "y"]) | st.text(max_size=4)
datatypes = st.sampled_from(["FP32", "INT8", "BOOL", "INT64", "FP16", "BYTES", "fp32"]) | json_values
dims = st.integers(-2, 5) | st.sampled_from([0, 2**31, 2**62, -(2**62)])
leaves = (st.integers(-200, 200) | st.floats(-1e40, 1e40, allow_nan=False) | st.booleans() | st.none()
          | st.sampled_from(["0.5", "NaN", "1", ""]))
data = st.lists(leaves, max_size=20) | st.lists(st.lists(leaves, max_size=4), max_size=6) | json_values


def valid_items(rows: int, x_values: list, k_values: list) -> list[dict]:
    return [{"name": "x", "datatype": "FP32", "shape": [rows, 3], "data": x_values},
            {"name": "k", "datatype": "INT8", "shape": [rows, 3], "data": k_values}]


MUTATIONS = ("name", "datatype", "shape", "element", "length", "nesting", "binary", "drop", "duplicate", "outputs",
             "parameters", "id")


@st.composite
def v2_requests(draw):
    """A valid request for IO, then up to three mutations of the kinds clients get wrong."""
    rows = draw(st.integers(1, 3))
    x_values = draw(st.lists(st.integers(-9, 9) | st.floats(-1e6, 1e6, allow_nan=False), min_size=3 * rows, max_size=3 * rows))
    k_values = draw(st.lists(st.integers(-128, 127), min_size=3 * rows, max_size=3 * rows))
    items = valid_items(rows, x_values, k_values)
    document = {"inputs": items}
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), max_size=3)):
        item = items[draw(st.integers(0, len(items) - 1))] if items else {}
        if mutation == "name":
            item["name"] = draw(names)
        elif mutation == "datatype":
            item["datatype"] = draw(datatypes)
        elif mutation == "shape":
            item["shape"] = draw(st.lists(dims, max_size=3) | json_values)
        elif mutation == "element" and isinstance(item.get("data"), list) and item["data"]:
            item["data"][draw(st.integers(0, len(item["data"]) - 1))] = draw(leaves)
        elif mutation == "length" and isinstance(item.get("data"), list):
            item["data"] = item["data"][: draw(st.integers(0, len(item["data"])))] or [draw(leaves)]
        elif mutation == "nesting" and isinstance(item.get("data"), list) and item.get("shape") == [rows, 3]:
            item["data"] = [item["data"][i:i + 3] for i in range(0, len(item["data"]), 3)]
        elif mutation == "binary":
            item.pop("data", None)
            item["parameters"] = draw(st.fixed_dictionaries({"binary_data_size": st.integers(-1, 64)}) | json_values)
        elif mutation == "drop" and items:
            items.remove(item)
        elif mutation == "duplicate" and items:
            items.append(dict(item))
        elif mutation == "outputs":
            document["outputs"] = draw(st.lists(st.fixed_dictionaries({"name": st.sampled_from(["y", "z", "w"])}), max_size=4)
                                       | json_values)
        elif mutation == "parameters":
            document["parameters"] = draw(st.fixed_dictionaries({"timeout": json_values}) | json_values)
        elif mutation == "id":
            document["id"] = draw(json_values)
    return document


@BOUNDED
@given(document=v2_requests(), binary=st.binary(max_size=96))
def test_structured_v2_requests_are_a_4xx_or_decoded_exactly(document, binary):
    header = dumps(document)
    uses_binary = any(isinstance(item.get("parameters"), dict) and "binary_data_size" in item["parameters"]
                      for item in document["inputs"])

    decoded = decodes_or_refuses(decode_v2, header + binary, len(header), IO)

    event("decoded" if decoded is not None else "refused")
    if decoded is not None and not uses_binary:
        assert_decoded_as_sent(decoded, IO, {item["name"]: item.get("data") for item in document["inputs"]})


@BOUNDED
@given(rows=st.lists(st.lists(leaves, min_size=3, max_size=3), min_size=1, max_size=4), keys=st.sampled_from(["x", "k"]))
def test_structured_predict_requests_are_a_4xx_or_decoded_exactly(rows, keys):
    document = {"model_name": "m", "inputs": {"x": rows, "k": rows}}

    decoded = decodes_or_refuses(decode_predict, document, IO)

    event("decoded" if decoded is not None else "refused")
    if decoded is not None:
        assert_decoded_as_sent(decoded, IO, {"x": rows, "k": rows})


@BOUNDED
@given(values=st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=3, max_size=3))
def test_binary_tensors_decode_to_their_bytes(values):
    x = np.array([values], np.float32)
    k = np.zeros((1, 3), np.int8)
    header = dumps({"inputs": [
        {"name": "x", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 12}},
        {"name": "k", "shape": [1, 3], "datatype": "INT8", "parameters": {"binary_data_size": 3}}]})

    decoded = decode_v2(header + x.tobytes() + k.tobytes(), len(header), IO)

    assert decoded.tensors[0].tobytes() == x.tobytes() and decoded.tensors[1].tolist() == [[0, 0, 0]]


def test_a_large_body_over_the_element_limit_is_refused_before_any_array_is_built():
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [10**5, 3], "datatype": "FP32", "data": [0.5] * (3 * 10**5)}]})

    started = time.perf_counter()
    refusal = decodes_or_refuses(decode_v2, body, None, IO)

    assert refusal is None
    assert time.perf_counter() - started < 1.0


# ---- through a real worker ------------------------------------------------------------


@pytest.fixture(scope="module")
def property_worker(tmp_path_factory, mlp_v1):
    tmp_path = tmp_path_factory.mktemp("property")
    state_file = write_state(tmp_path / "state.json", state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}))
    worker = ThreadedWorker(make_config(tmp_path), state_file).start()
    with httpx.Client(timeout=10.0) as http:
        yield worker, http
    worker.stop()


@settings(max_examples=120, deadline=timedelta(seconds=5), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=512) | v2_requests().map(dumps) | json_values.map(dumps),
       path=st.sampled_from(["/v2/models/digits/infer", "/predict", "/v2/models/digits/versions/1/infer"]),
       header_length=st.none() | st.integers(-3, 600).map(str) | st.just("9" * 400))
def test_no_request_body_makes_the_worker_answer_5xx(property_worker, body, path, header_length):
    worker, http = property_worker
    headers = {} if header_length is None else {"Inference-Header-Content-Length": header_length}

    response = http.post(worker.url + path, content=body, headers=headers)

    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert set(orjson.loads(response.content)) == {"error"}
        assert len(response.content) < 600


def test_finite_floats_of_any_size_round_trip_or_are_refused():
    for value in (3.4e38, 3.5e38, -3.5e38, 1e-50, math.pi):
        document = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [value] * 3},
                               {"name": "k", "shape": [1, 3], "datatype": "INT8", "data": [1, 2, 3]}]}
        decoded = decodes_or_refuses(decode_v2, dumps(document), None, IO)
        if decoded is not None:
            assert (decoded.tensors[0] == np.float32(value)).all(), (value, decoded.tensors[0])  # the value itself, not a clamp
        else:
            assert abs(value) > float(np.finfo(np.float32).max)


def test_load_object_refuses_every_non_object():
    for body in (b"[]", b"1", b'"s"', b"null", b"true"):
        assert decodes_or_refuses(load_object, body) is None
