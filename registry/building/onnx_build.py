"""Build small, real ONNX models from NumPy weights, offline.

Used by the demo models, the benchmarks and the tests. Imports no Django, so the
serving tests and the bench scripts can use it too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
BATCH_DIM = "batch"


def mlp_from_weights(
    weights: Sequence[np.ndarray],
    biases: Sequence[np.ndarray],
    *,
    input_name: str = "input",
    output_name: str = "probabilities",
    softmax: bool = True,
    name: str = "mlp",
) -> onnx.ModelProto:
    """A float32 MLP: Gemm+Relu between layers, optional Softmax at the end.

    The batch dimension is symbolic, so any batch size runs.
    """
    if len(weights) != len(biases) or not weights:
        raise ValueError("need one bias per weight matrix, and at least one layer")
    nodes, initializers = [], []
    current = input_name
    for index, (weight, bias) in enumerate(zip(weights, biases)):
        weight_name, bias_name, out = f"W{index}", f"B{index}", f"gemm{index}"
        initializers.append(numpy_helper.from_array(np.asarray(weight, np.float32), weight_name))
        initializers.append(numpy_helper.from_array(np.asarray(bias, np.float32), bias_name))
        nodes.append(helper.make_node("Gemm", [current, weight_name, bias_name], [out]))
        current = out
        if index < len(weights) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"relu{index}"]))
            current = f"relu{index}"
    nodes.append(helper.make_node("Softmax" if softmax else "Identity", [current], [output_name], **({"axis": -1} if softmax else {})))
    n_in, n_out = weights[0].shape[0], weights[-1].shape[1]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [BATCH_DIM, n_in])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [BATCH_DIM, n_out])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelops-console")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def random_mlp(layer_sizes: Sequence[int], *, seed: int = 0, softmax: bool = True, name: str = "mlp") -> onnx.ModelProto:
    """An MLP with He-initialised random weights, e.g. ``random_mlp([64, 128, 10])``."""
    rng = np.random.default_rng(seed)
    weights, biases = [], []
    for fan_in, fan_out in zip(layer_sizes[:-1], layer_sizes[1:]):
        weights.append(rng.standard_normal((fan_in, fan_out), dtype=np.float32) * np.sqrt(2.0 / fan_in))
        biases.append(rng.standard_normal(fan_out, dtype=np.float32) * 0.01)
    return mlp_from_weights(weights, biases, softmax=softmax, name=name)


def to_bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()
