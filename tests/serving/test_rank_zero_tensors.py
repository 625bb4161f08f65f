"""Tensors of no dimensions (a scalar: a temperature, a threshold, a count) keep their
shape `[]` both ways, as the model's metadata and ONNX Runtime give it. The answer said
`[1]` (NumPy's `ascontiguousarray` makes at least one dimension), so a Triton client's
`as_numpy` handed back an array of another rank than the model's; and `/predict` had no
form that such an input accepted."""

from __future__ import annotations

import numpy as np
import onnx
import orjson
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper
from serving_testkit import route, state, write_model


def doubled_scalar() -> onnx.ModelProto:
    """x FP32 [] -> y = x + x, FP32 []."""
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "doubled",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def scalar_model(model_dir):
    return write_model(model_dir, "doubled_scalar", doubled_scalar())


@pytest.fixture
def scalar_worker(start_worker, scalar_model):
    return start_worker(state(1, {"scalar": {"routes": [route(1, 100, *scalar_model, batchable=False)]}}))


SCALAR_INPUT = {"inputs": [{"name": "x", "shape": [], "datatype": "FP32", "data": [3.0]}]}


def test_a_scalar_output_is_answered_with_shape_empty_in_json(scalar_worker, client):
    answer = client.post(scalar_worker.url + "/v2/models/scalar/infer", json=SCALAR_INPUT)

    assert answer.status_code == 200
    assert answer.json()["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [], "data": [6.0]}]


def test_a_scalar_output_is_answered_with_shape_empty_as_binary(scalar_worker, client):
    body = {**SCALAR_INPUT, "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}

    answer = client.post(scalar_worker.url + "/v2/models/scalar/infer", json=body)

    header_length = int(answer.headers["inference-header-content-length"])
    header = orjson.loads(answer.content[:header_length])
    assert header["outputs"][0]["shape"] == []
    assert np.frombuffer(answer.content[header_length:], np.float32).tolist() == [6.0]


def test_a_triton_client_reads_a_scalar_output_as_an_array_of_no_dimensions(scalar_worker):
    server = triton.InferenceServerClient(scalar_worker.url.removeprefix("http://"))
    given = triton.InferInput("x", [], "FP32")
    given.set_data_from_numpy(np.array(3.0, np.float32))

    result = server.infer("scalar", [given]).as_numpy("y")

    assert (result.shape, result.tolist()) == ((), 6.0)


@pytest.mark.parametrize("inputs", [3.0, {"x": 3.0}], ids=["the value", "by input name"])
def test_predict_takes_a_scalar_input_as_its_value_and_answers_the_value(scalar_worker, client, inputs):
    answer = client.post(scalar_worker.url + "/predict", json={"model_name": "scalar", "inputs": inputs})

    assert answer.status_code == 200
    assert answer.json()["outputs"] == {"y": 6.0}


def test_predict_refuses_a_list_for_a_scalar_input_naming_the_rank(scalar_worker, client):
    answer = client.post(scalar_worker.url + "/predict", json={"model_name": "scalar", "inputs": {"x": [3.0]}})

    assert answer.status_code == 400
    assert "rank 0" in answer.json()["error"]
