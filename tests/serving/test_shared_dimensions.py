"""Inputs that name the same symbolic dimension (a BERT-style model's input_ids and
attention_mask, both [N, S]) must agree on it. ONNX Runtime checks no such thing before
the run, and reported the Mul's broadcast failure as the model's own (500): any client
could put server errors on a canary. The worker refuses the request first, 400 naming
both inputs, the dimension and both sizes, counted as the client's error."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving_testkit import route, state, tokens_times_mask, write_model

from serving.engine import TensorSpec
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
