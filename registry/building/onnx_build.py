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


def random_convnet(
    *, channels: int = 3, size: int = 32, classes: int = 10, seed: int = 0, name: str = "convnet",
    input_name: str = "input", output_name: str = "probabilities",
) -> onnx.ModelProto:
    """A small float32 image classifier, ``[batch, channels, size, size]`` → ``[batch, classes]``:
    Conv 3×3 (16, same padding) → Relu → Conv 3×3 stride 2 (32) → Relu → GlobalAveragePool
    → Flatten → Gemm → Softmax, He-initialised random weights.

    Every operator works per image, so rows batched together give the answers they give
    alone (the console's batchability proof); the batch dimension is symbolic."""
    rng = np.random.default_rng(seed)

    def he(shape, fan_in):
        return (rng.standard_normal(shape, dtype=np.float32) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    initializers = [
        numpy_helper.from_array(he((16, channels, 3, 3), channels * 9), "C0"),
        numpy_helper.from_array(np.zeros(16, np.float32), "CB0"),
        numpy_helper.from_array(he((32, 16, 3, 3), 16 * 9), "C1"),
        numpy_helper.from_array(np.zeros(32, np.float32), "CB1"),
        numpy_helper.from_array(he((32, classes), 32), "W"),
        numpy_helper.from_array((rng.standard_normal(classes, dtype=np.float32) * 0.01).astype(np.float32), "B"),
    ]
    nodes = [
        helper.make_node("Conv", [input_name, "C0", "CB0"], ["conv0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv0"], ["relu0"]),
        helper.make_node("Conv", ["relu0", "C1", "CB1"], ["conv1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Relu", ["conv1"], ["relu1"]),
        helper.make_node("GlobalAveragePool", ["relu1"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "W", "B"], ["logits"]),
        helper.make_node("Softmax", ["logits"], [output_name], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [BATCH_DIM, channels, size, size])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [BATCH_DIM, classes])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelops-console")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


# ---- models with a planted regression (the rollout tests and bench/rollout_bench.py) ----


def mlp_dropping_rows(layer_sizes: Sequence[int], *, seed: int = 0, feature: int = 0, above: float = 5.0,
                      name: str = "mlp-drops-rows") -> onnx.ModelProto:
    """``random_mlp(layer_sizes, seed=seed)``'s answers, except that rows whose input
    ``feature`` is above ``above`` are left out of the output (ONNX ``Compress`` on the
    batch axis): a request carrying such a row gets fewer output rows than input rows,
    which a worker answers with 500. Zeros (the inspection's smoke runs) and the
    batchability probe's standard-normal rows stay below the default threshold, so the
    model uploads as a ready, batchable version that fails only on the inputs that
    trigger it."""
    model = random_mlp(layer_sizes, seed=seed, name=name)
    graph = model.graph
    output_name, inner = graph.output[0].name, f"{graph.output[0].name}_all_rows"
    for node in graph.node:  # the MLP's last node now feeds the Compress
        node.output[:] = [inner if output == output_name else output for output in node.output]
    graph.initializer.extend([
        numpy_helper.from_array(np.array(feature, np.int64), "drop_feature"),  # a scalar index: Gather gives [batch]
        numpy_helper.from_array(np.array(above, np.float32), "drop_above"),
    ])
    graph.node.extend([
        helper.make_node("Gather", [graph.input[0].name, "drop_feature"], ["drop_values"], axis=1),
        helper.make_node("Greater", ["drop_values", "drop_above"], ["drop_row"]),
        helper.make_node("Not", ["drop_row"], ["keep_row"]),
        helper.make_node("Compress", [inner, "keep_row"], [output_name], axis=0),
    ])
    onnx.checker.check_model(model, full_check=True)
    return model


def mlp_favouring_class(layer_sizes: Sequence[int], *, seed: int = 0, favoured: int = 3, bias: float = 8.0,
                        name: str = "mlp-favours-class") -> onnx.ModelProto:
    """``random_mlp(layer_sizes, seed=seed)`` with ``bias`` added to class ``favoured``'s
    logit: as fast and as error-free as the original, but it predicts ``favoured`` for
    most rows (a shift in the predicted-class distribution, nothing else)."""
    model = random_mlp(layer_sizes, seed=seed, name=name)
    last = model.graph.initializer[-1]  # the last layer's bias (random_mlp adds W, B per layer)
    values = numpy_helper.to_array(last).copy()
    values[favoured] += bias
    last.CopyFrom(numpy_helper.from_array(values.astype(np.float32), last.name))
    onnx.checker.check_model(model, full_check=True)
    return model
