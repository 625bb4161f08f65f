"""Inputs that name the same symbolic dimension (a BERT-style model's input_ids and
attention_mask, both [N, S]) must agree on it. ONNX Runtime checks no such thing before
the run, and reported the Mul's broadcast failure as the model's own (500): any client
could put server errors on a canary. The worker refuses the request first, 400 naming
both inputs, the dimension and both sizes, counted as the client's error. Dimensions no
shared name ties are found disagreeing by ONNX Runtime's kernel; that refusal is the
client's error too."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from prometheus_client.parser import text_string_to_metric_families
from serving_testkit import route, state, tokens_times_mask, write_model

from serving.engine import TensorSpec
from serving.loaded_version import request_error
from serving.protocol import ModelIO

MISMATCH = {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1, 0, 0]]}
MESSAGE = ("inputs 'input_ids' and 'attention_mask' must agree on dimension 'S': "
           "3 in 'input_ids' (axis 1), 5 in 'attention_mask' (axis 1)")


def v2_tokens(inputs: dict) -> dict:
    return {"inputs": [{"name": name, "shape": [len(rows), len(rows[0])], "datatype": "INT64",
                        "data": [value for row in rows for value in row]} for name, rows in inputs.items()]}


REQUESTS = {
    "v2": lambda model: ("/v2/models/{model}/infer", v2_tokens(MISMATCH)),
    "predict": lambda model: ("/predict", {"model_name": model, "inputs": MISMATCH}),
}


@pytest.fixture(scope="module")
def tokens_model(model_dir):
    return write_model(model_dir, "tokens_times_mask", tokens_times_mask())


def series(client, worker, name: str, **labels) -> float:
    """One sample of the worker's /metrics, 0 when the series does not exist."""
    for family in text_string_to_metric_families(client.get(worker.url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


@pytest.mark.parametrize("endpoint", REQUESTS)
def test_inputs_disagreeing_on_a_shared_dimension_are_a_400_naming_both_and_their_sizes(start_worker, client, tokens_model,
                                                                                        endpoint):
    model = f"tokens-{endpoint}"
    worker = start_worker(state(1, {model: {"routes": [route(1, 100, *tokens_model)]}}))
    path, body = REQUESTS[endpoint](model)

    answer = client.post(worker.url + path.format(model=model), json=body)

    assert (answer.status_code, answer.json()) == (400, {"error": MESSAGE})
    assert answer.headers["x-model-version"] == "1"


@pytest.mark.parametrize("endpoint", REQUESTS)
def test_a_shared_dimension_mismatch_is_counted_as_a_client_error_not_a_failure(start_worker, client, tokens_model, endpoint):
    model = f"tokens-counted-{endpoint}"
    worker = start_worker(state(1, {model: {"routes": [route(1, 100, *tokens_model)]}}))
    failed_before = client.get(worker.url + "/health").json()["requests_failed_total"]
    path, body = REQUESTS[endpoint](model)

    for _ in range(3):
        client.post(worker.url + path.format(model=model), json=body)

    assert series(client, worker, "modelops_requests_total", model=model, version="1", code="400") == 3
    assert series(client, worker, "modelops_requests_total", model=model, version="1", code="500") == 0
    assert client.get(worker.url + "/health").json()["requests_failed_total"] == failed_before


def test_inputs_agreeing_on_a_shared_dimension_are_served(start_worker, client, tokens_model):
    worker = start_worker(state(1, {"tokens-agree": {"routes": [route(1, 100, *tokens_model)]}}))
    inputs = {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 0]]}

    answer = client.post(worker.url + "/v2/models/tokens-agree/infer", json=v2_tokens(inputs))

    assert answer.status_code == 200
    assert answer.json()["outputs"][0]["data"] == [1, 2, 0]


def test_only_dimensions_named_by_more_than_one_input_are_checked():
    """Found once per version: a model with no shared name checks nothing per request."""
    ids, mask = TensorSpec("ids", "INT64", (None, None), ("N", "S")), TensorSpec("mask", "INT64", (None, None), ("N", "T"))

    io = ModelIO((ids, mask), (), True, 1000)

    assert io.shared_dims == (("N", ((0, 0), (1, 0))),)
    assert ModelIO((ids,), (), True, 1000).shared_dims == ()


def pair_model(op: str, first: list, second: list, **attributes) -> onnx.ModelProto:
    """``op``(a, b) over FLOAT inputs whose non-batch dimensions are named apart or not at
    all (some exporters name each tensor's dimensions apart, ``unk__N``): no name tells the
    worker they must agree, so only ONNX Runtime's kernel finds that they do not."""
    graph = helper.make_graph(
        [helper.make_node(op, ["a", "b"], ["y"], **attributes)], op.lower(),
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, first),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, second)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


KERNEL_SHAPE_CHECKS = {
    # op, the inputs' declared dimensions, the sizes sent, what ONNX Runtime's kernel says
    "broadcast-unlike-names": ("Mul", ["N", "S"], ["N", "T"], (1, 3), (1, 5), "Mul node: Attempting to broadcast"),
    "broadcast-unnamed": ("Add", ["N", None], ["N", None], (1, 3), (1, 5), "Add node: Attempting to broadcast"),
    "matmul": ("MatMul", ["N", "S", "K"], ["N", "T", "J"], (1, 2, 3), (1, 4, 2), "MatMul node: MatMul dimension mismatch"),
    "concat": ("Concat", ["N", "S"], ["N", "T"], (1, 3), (1, 5), "Concat node: Non concat axis dimensions must match"),
}


@pytest.mark.parametrize("case", KERNEL_SHAPE_CHECKS)
def test_inputs_a_kernel_finds_disagreeing_are_a_400_counted_as_the_clients(start_worker, client, model_dir, case):
    op, first, second, first_shape, second_shape, said = KERNEL_SHAPE_CHECKS[case]
    model = f"pair-{case}"
    graph = pair_model(op, first, second, **({"axis": 0} if op == "Concat" else {}))
    worker = start_worker(state(1, {model: {"routes": [route(1, 100, *write_model(model_dir, model, graph))]}}))
    body = {"inputs": [{"name": name, "shape": list(shape), "datatype": "FP32", "data": [1.0] * math.prod(shape)}
                       for name, shape in (("a", first_shape), ("b", second_shape))]}

    answers = [client.post(worker.url + f"/v2/models/{model}/infer", json=body) for _ in range(3)]

    assert [answer.status_code for answer in answers] == [400] * 3
    assert answers[0].json()["error"].startswith("the model refused these inputs' shapes: ")
    assert said in answers[0].json()["error"]
    assert series(client, worker, "modelops_requests_total", model=model, version="1", code="500") == 0


def test_a_kernel_failure_other_than_a_shape_check_is_still_the_models():
    """Only the kernels' comparisons of two shapes are the client's: a Reshape the graph
    cannot make of the size it was given fails the version (500)."""
    target = numpy_helper.from_array(np.array([-1, 4], np.int64), "target")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "target"], ["y"])], "fours",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [target])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception) as failure:
        session.run(None, {"x": np.ones((1, 3), np.float32)})

    assert request_error(failure.value).status == 500
