"""One bad request fails alone; a version not proven batchable never mixes clients' rows.

Real ONNX Runtime sessions behind a real LoadedVersion; the engine is held on its first
batch so the requests after it queue into one batch, deterministically."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import onnx
import orjson
import pytest
from onnx import TensorProto, helper

from serving.engine import Engine
from serving.errors import BadRequest, ModelFailed
from serving.protocol import Decoded, decode_v2
from serving.console_client import ConsoleClient
from serving.loaded_version import LoadedVersion
from serving.repository import Repository
from serving.serving_plan import parse_state
from serving_testkit import HeldRun, make_config, route, state, write_model

TABLE = np.arange(6, dtype=np.float32).reshape(3, 2)  # row i is [2i, 2i+1]


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def gather_model() -> onnx.ModelProto:
    """index [batch] INT64 -> rows of a 3x2 table: batchable; an index >= 3 is refused by ORT."""
    return _model(
        [helper.make_node("Gather", ["table", "index"], ["rows"], axis=0)],
        [helper.make_tensor_value_info("index", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor("table", TensorProto.FLOAT, [3, 2], TABLE.ravel().tolist())],
    )


def sum_over_rows_model() -> onnx.ModelProto:
    """x [n, 4] -> the sum of its rows, [1, 4]: a dynamic first dimension that is NOT a batch."""
    return _model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [0])],
    )


@pytest.fixture
def load(tmp_path):
    """load(model, signature) -> (LoadedVersion, HeldRun), closed after the test."""
    loaded = []

    def load_version(model: onnx.ModelProto, signature: dict, name: str = "m") -> tuple[LoadedVersion, HeldRun]:
        path, sha256 = write_model(tmp_path, f"{name}{len(loaded)}", model)
        config = make_config(tmp_path)
        desired = state(1, {name: {"routes": [{**route(1, 100, path, sha256), "signature": signature}]}})
        spec = parse_state(desired, config)[1].versions[0]
        engine = Engine(path.read_bytes(), config, "cpu")
        held = engine.run = HeldRun(engine.run)
        version = LoadedVersion(spec, engine, config)
        loaded.append(version)
        return version, held

    yield load_version
    for version in loaded:
        version.close()


def decoded(version: LoadedVersion, array: np.ndarray) -> Decoded:
    """`array` as the worker decodes a V2 request for `version`'s only input."""
    spec = version.io.inputs[0]
    tensor = {"name": spec.name, "shape": list(array.shape), "datatype": spec.datatype, "data": array.ravel().tolist()}
    return decode_v2(orjson.dumps({"inputs": [tensor]}), None, version.io)


async def submit_behind_a_held_batch(version: LoadedVersion, held: HeldRun, first: Decoded, rest: list[Decoded]):
    """The first request runs (held); the rest queue meanwhile, then the engine is released."""
    futures = [version.submit(first, time.monotonic() + 5, "first")]
    assert await asyncio.to_thread(held.entered.wait, 5)
    futures += [version.submit(request, time.monotonic() + 5, f"r{i}") for i, request in enumerate(rest)]
    held.release.set()
    return await asyncio.gather(*futures, return_exceptions=True)


async def test_index_onnx_runtime_refuses_fails_only_its_own_request(load):
    version, held = load(gather_model(), {"batchable": True})
    indices = [np.array([0], np.int64), np.array([7], np.int64), np.array([2, 1], np.int64)]

    results = await submit_behind_a_held_batch(version, held, decoded(version, np.array([1], np.int64)),
                                               [decoded(version, index) for index in indices])

    assert results[0][0].tolist() == [[2.0, 3.0]]
    assert results[1][0].tolist() == [[0.0, 1.0]]
    assert type(results[2]) is BadRequest
    assert results[2].status == 400
    assert "the model refused this input" in results[2].message
    assert "out of data bounds" in results[2].message
    assert results[3][0].tolist() == [[4.0, 5.0], [2.0, 3.0]]
    assert held.rows == [1, 4, 1, 3, 1, 2]  # the batch of 4 rows, then its halves, then the failed half's
    assert version.queue_depth == 0


async def test_many_good_requests_around_one_bad_one_are_all_answered(load):
    version, held = load(gather_model(), {"batchable": True})
    indices = [0, 1, 2, 0, 1, 9, 2, 0]

    results = await submit_behind_a_held_batch(version, held, decoded(version, np.array([0], np.int64)),
                                               [decoded(version, np.array([index], np.int64)) for index in indices])

    answers = [result if isinstance(result, Exception) else result[0].tolist() for result in results[1:]]
    assert [type(answer) for answer in answers].count(BadRequest) == 1
    assert type(answers[5]) is BadRequest
    assert [answer for i, answer in enumerate(answers) if i != 5] == [TABLE[[i]].tolist() for i in (0, 1, 2, 0, 1, 2, 0)]
    assert held.rows == [1, 8, 4, 4, 2, 1, 1, 2]  # a bisection: 7 runs after the batch, not 8 solo ones


async def test_non_batchable_version_answers_each_client_with_its_own_sum(load):
    version, held = load(sum_over_rows_model(), {"batchable": False})
    ones, twos = np.ones((2, 4), np.float32), np.full((3, 4), 2.0, np.float32)

    results = await submit_behind_a_held_batch(version, held, decoded(version, np.zeros((1, 4), np.float32)),
                                               [decoded(version, ones), decoded(version, twos)])

    assert results[1][0].tolist() == [[2.0, 2.0, 2.0, 2.0]]
    assert results[2][0].tolist() == [[6.0, 6.0, 6.0, 6.0]]
    assert held.rows == [1, 2, 3]  # three runs, one per client: never concatenated
    assert version.policy.max_batch_size == 1


async def test_version_without_a_batchable_flag_is_not_batched(load):
    version, held = load(sum_over_rows_model(), {})

    results = await submit_behind_a_held_batch(version, held, decoded(version, np.zeros((1, 4), np.float32)),
                                               [decoded(version, np.ones((1, 4), np.float32)) for _ in range(3)])

    assert [result[0].tolist() for result in results] == [[[0.0] * 4]] + [[[1.0] * 4]] * 3
    assert held.rows == [1, 1, 1, 1]
    assert version.is_batchable is False


async def test_batch_without_one_output_row_per_input_row_is_run_again_alone(load):
    version, held = load(sum_over_rows_model(), {"batchable": True})  # the flag is wrong: the worker notices

    results = await submit_behind_a_held_batch(version, held, decoded(version, np.zeros((1, 4), np.float32)),
                                               [decoded(version, np.full((1, 4), value, np.float32))
                                                for value in (1.0, 5.0)])

    assert results[1][0].tolist() == [[1.0] * 4]
    assert results[2][0].tolist() == [[5.0] * 4]  # never the sum of both clients (6.0)
    assert held.rows == [1, 2, 1, 1]


async def test_lone_request_whose_output_has_the_wrong_rows_gets_a_500_naming_the_output(load):
    version, held = load(sum_over_rows_model(), {"batchable": True})
    held.release.set()

    with pytest.raises(ModelFailed) as failure:
        await version.submit(decoded(version, np.ones((3, 4), np.float32)), time.monotonic() + 5, "r")

    assert failure.value.status == 500
    assert failure.value.message == ("output 'total' has shape [1, 4], not one row per input row (3): "
                                     "this version cannot answer this request")
    assert version.queue_depth == 0


def test_input_onnx_runtime_refuses_is_a_400_over_http_and_the_version_keeps_serving(tmp_path, start_worker, client):
    path, sha256 = write_model(tmp_path, "gather", gather_model())
    worker = start_worker(state(1, {"lookup": {"routes": [route(1, 100, path, sha256)]}}))
    url = f"{worker.url}/v2/models/lookup/infer"

    def body(indices):
        return {"inputs": [{"name": "index", "shape": [len(indices)], "datatype": "INT64", "data": indices}]}

    refused = client.post(url, json=body([1, 3]))
    served = client.post(url, json=body([2]))

    assert refused.status_code == 400
    assert refused.json()["error"].startswith("the model refused this input: indices element out of data bounds")
    assert served.status_code == 200
    assert served.json()["outputs"][0]["data"] == [4.0, 5.0]


def test_non_batchable_version_over_http_returns_its_whole_output(tmp_path, start_worker, client):
    path, sha256 = write_model(tmp_path, "sum", sum_over_rows_model())
    worker = start_worker(state(1, {"sum": {"routes": [route(1, 100, path, sha256, batchable=False)]}}))
    rows = [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0], [100.0, 200.0, 300.0, 400.0]]

    answer = client.post(f"{worker.url}/v2/models/sum/infer",
                         json={"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32", "data": sum(rows, [])}]})

    assert answer.status_code == 200
    assert answer.json()["outputs"][0]["shape"] == [1, 4]
    assert answer.json()["outputs"][0]["data"] == [111.0, 222.0, 333.0, 444.0]


def test_concurrent_clients_of_a_non_batchable_version_each_get_their_own_sum(tmp_path, start_worker):
    path, sha256 = write_model(tmp_path, "sum", sum_over_rows_model())
    worker = start_worker(state(1, {"sum": {"routes": [route(1, 100, path, sha256, batchable=False)]}},
                                max_queue_delay_s=0.05))

    async def ask(http: httpx.AsyncClient, value: float) -> list[float]:
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [value] * 4}]}
        answer = await http.post(f"{worker.url}/v2/models/sum/infer", json=body)
        assert answer.status_code == 200
        return answer.json()["outputs"][0]["data"]

    async def ask_all() -> list[list[float]]:
        async with httpx.AsyncClient(timeout=10) as http:
            return await asyncio.gather(*(ask(http, float(value)) for value in range(1, 25)))

    assert asyncio.run(ask_all()) == [[float(value)] * 4 for value in range(1, 25)]


async def test_new_batching_settings_never_make_a_non_batchable_version_batch(tmp_path):
    path, sha256 = write_model(tmp_path, "sum", sum_over_rows_model())
    client = ConsoleClient("http://127.0.0.1:9", "", 1.0, allow_local=True)
    repository = Repository(make_config(tmp_path), "cpu", client.fetch_artifact)
    routes = {"sum": {"routes": [route(1, 100, path, sha256, batchable=False)]}}
    try:
        assert (await repository.apply(state(1, routes, max_batch_size=8)))["ok"] is True
        version = repository.loaded[("sum", 1)]

        assert (await repository.apply(state(2, routes, max_batch_size=32)))["ok"] is True

        assert repository.loaded[("sum", 1)] is version
        assert (version.is_batchable, version.policy.max_batch_size, version.io.is_batchable) == (False, 1, False)
    finally:
        await repository.close()
