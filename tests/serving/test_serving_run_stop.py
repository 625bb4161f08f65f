"""A run that outlives every deadline it serves is stopped: its requests are answered 504
at the deadline and ONNX Runtime stops computing (serving/run_stop.py). The model here
loops as many times as its input says: zeros (the warm-up) cost nothing, a large value
costs as long as the client names, which an audit used to hold a core for 25 s past a
5 s deadline."""

from __future__ import annotations

import asyncio
import hashlib
import resource
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from serving.errors import DeadlineExceeded
from serving.protocol import Decoded
from serving_testkit import route, state


def input_driven_loop() -> bytes:
    """y = x + n, computed one addition at a time, n the largest value of x."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["keep_in"], ["keep_out"]), helper.make_node("Add", ["total_in", "one"], ["total_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("keep_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("total_in", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("keep_out", TensorProto.BOOL, []), helper.make_tensor_value_info("total_out", TensorProto.FLOAT, ["batch", 4])],
    )
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["largest"], keepdims=0),
        helper.make_node("Cast", ["largest"], ["trips"], to=TensorProto.INT64),
        helper.make_node("Loop", ["trips", "keep_going", "x"], ["y"], body=body),
    ]
    graph = helper.make_graph(nodes, "input-driven", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              [numpy_helper.from_array(np.array(True), "keep_going"), numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.fixture
async def looping(repository, tmp_path):
    data = input_driven_loop()
    path = tmp_path / "loop.onnx"
    path.write_bytes(data)
    result = await repository.apply(state(1, {"loop": {"routes": [route(1, 100, path, hashlib.sha256(data).hexdigest())]}}))
    assert result["ok"], result
    return repository.router.table.resolve("loop", None)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def test_a_small_input_is_answered(looping):
    outputs = await looping.submit(Decoded((np.full((1, 4), 3, np.float32),), 1), time.monotonic() + 5, "small")

    assert outputs[0].tolist() == [[6.0] * 4]


async def test_a_run_past_its_deadline_is_answered_504_at_the_deadline_and_stops_computing(looping):
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="its run was stopped"):  # 2e7 iterations: about a minute on this box
        await asyncio.wait_for(looping.submit(Decoded((np.full((1, 4), 2e7, np.float32),), 1), started + 0.5, "endless"), 5)
    answered_after_s = time.monotonic() - started

    await asyncio.sleep(0.2)  # ONNX Runtime stops at the next iteration
    before = cpu_seconds()
    await asyncio.sleep(1.0)
    burnt = cpu_seconds() - before

    assert answered_after_s < 1.5
    assert burnt < 0.3, f"{burnt:.2f} CPU-s in 1 s after the answer: the run goes on"
    outputs = await looping.submit(Decoded((np.full((1, 4), 2, np.float32),), 1), time.monotonic() + 5, "next")
    assert outputs[0].tolist() == [[4.0] * 4]  # the engine is free again
