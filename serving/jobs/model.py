"""The model of a job: loaded like a worker loads it, and run over chunks of rows.

A file's first axis is always its rows. A batchable model (every input's first
dimension dynamic) gets a chunk as one batch; any other model gets one row per run,
stacked along a leading axis of 1 where its inputs have one, whole otherwise. Outputs
come back as one array per output with a leading axis of rows either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from serving.config import ServingConfig
from serving.engine import Engine, TensorSpec, resolve_device
from serving.jobs.formats import InputLayout, input_layout, short

MAX_ERROR_CHARS = 300
# Input bytes in memory at once: rows per batch are capped so that the batches held at the same
# time (one, or a batch job's input buffers), not the file, bound memory.
BATCH_BUDGET_BYTES = 64 * 1024 * 1024


class RunError(Exception):
    """ONNX Runtime refused or failed these rows; `reason` is its message, shortened."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def load_engine(model: Path | bytes, config: ServingConfig) -> Engine:
    """The session of the model (its file, or its bytes as read and checked once) the way a
    worker builds it, with the worker's SERVING_* options."""
    return Engine(model if isinstance(model, bytes) else Path(model).read_bytes(), config, resolve_device(config))


def rows_per_batch(batch_size: int, row_bytes: int, batches_at_once: int = 1) -> int:
    return max(1, min(batch_size, BATCH_BUDGET_BYTES // (batches_at_once * max(1, row_bytes))))


def input_layouts(engine: Engine) -> tuple[InputLayout, ...]:
    return tuple(_layout(spec, engine.is_batchable) for spec in engine.inputs)


def _layout(spec: TensorSpec, batchable: bool) -> InputLayout:
    return input_layout(spec.name, spec.dtype, spec.shape, batchable)  # the rule the console checks uploads with


def run_rows(engine: Engine, layouts: Sequence[InputLayout], arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The outputs for `arrays` (each with a leading axis of rows), each with one row per input row."""
    rows = len(arrays[0])
    if engine.is_batchable:
        outputs = _run(engine, tuple(arrays))
        _require_rows(engine, outputs, rows)
        return outputs
    per_row = [run_one(engine, layouts, [array[index] for array in arrays]) for index in range(rows)]
    return [_stack(engine.outputs[position], [outputs[position] for outputs in per_row])
            for position in range(len(engine.outputs))]


def run_one(engine: Engine, layouts: Sequence[InputLayout], row: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The outputs of one row (each row array without a leading axis), each without one too."""
    feeds = tuple(array[np.newaxis] if layout.stacked else array for array, layout in zip(row, layouts))
    outputs = _run(engine, feeds)
    if engine.is_batchable:
        _require_rows(engine, outputs, 1)
        return [output[0] for output in outputs]
    has_batch_axis = any(layout.stacked for layout in layouts)
    return [output[0] if has_batch_axis and output.ndim and output.shape[0] == 1 else output for output in outputs]


def _run(engine: Engine, feeds: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    try:
        return engine.run(feeds)
    except Exception as error:  # noqa: BLE001 - ORT raises its own classes (Fail, InvalidArgument, ...)
        raise RunError(describe_failure(error)) from None


def describe_failure(error: BaseException) -> str:
    return " ".join(str(error).split())[:MAX_ERROR_CHARS]


def _require_rows(engine: Engine, outputs: Sequence[np.ndarray], rows: int) -> None:
    for spec, output in zip(engine.outputs, outputs):
        if output.ndim == 0 or output.shape[0] != rows:
            raise RunError(f"the model returned output '{short(spec.name)}' with shape {list(output.shape)} "
                           f"for {rows} rows; every output needs one row per input row")


def _stack(spec: TensorSpec, rows: Sequence[np.ndarray]) -> np.ndarray:
    if len({row.shape for row in rows}) > 1:
        raise RunError(f"output '{short(spec.name)}' changed shape from row to row")
    return np.stack(rows)
