"""The batch command: run a model over every row of a file, streaming, into an output file.

Memory is bounded by one batch: rows are read a batch at a time, and a batch is capped
both by --batch-size and by BATCH_BUDGET_BYTES of input. In `.jsonl` and `.csv` each
line is checked before it joins a batch, and a batch that fails is re-run one row at a
time, so a bad row gets its own error and its neighbours their outputs. In `.npy` and
`.npz` there is no place for a row's error: the first failing row fails the job, named.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np

from serving.config import ServingConfig
from serving.engine import Engine
from serving.jobs.formats import (
    ARRAY_FORMATS,
    ArrayFile,
    FormatError,
    InputLayout,
    Row,
    count_lines,
    csv_layout,
    csv_rows,
    group_rows,
    jsonl_rows,
    require_numeric_inputs,
    stack_feeds,
)
from serving.jobs.model import (
    BATCH_BUDGET_BYTES,
    RunError,
    input_layouts,
    load_engine,
    rows_per_batch,
    run_one,
    run_rows,
)
from serving.jobs.protocol import Progress, peak_rss_bytes
from serving.jobs.writers import open_writer, output_format_for


def run(model: Path, input_path: Path, file_format: str, output: Path, batch_size: int) -> dict:
    engine = load_engine(model, ServingConfig.from_env())
    layouts = input_layouts(engine)
    output_format = output_format_for(file_format, len(engine.outputs))
    if not engine.is_batchable:
        batch_size = 1
    if file_format in ARRAY_FORMATS:
        rows, errors, output_bytes, batch_size = _run_arrays(engine, layouts, input_path, file_format, output,
                                                              output_format, batch_size)
    else:
        rows, errors, output_bytes = _run_lines(engine, layouts, input_path, file_format, output, batch_size)
    return {"rows": rows, "errors": errors, "output_format": output_format, "output_bytes": output_bytes,
            "peak_rss_bytes": peak_rss_bytes(), "batch_size": batch_size}


@contextmanager
def _writing(writer):
    try:
        yield writer
    except BaseException:
        writer.abort()
        raise


def _run_arrays(engine: Engine, layouts: tuple[InputLayout, ...], input_path: Path, file_format: str,
                output: Path, output_format: str, batch_size: int) -> tuple[int, int, int, int]:
    with ArrayFile(input_path, file_format) as arrays:
        members = arrays.match_inputs(layouts)
        row_bytes = sum(max(arrays.header(member).row_bytes, layout.row_bytes_hint)
                        for member, layout in zip(members, layouts))
        size = rows_per_batch(batch_size, row_bytes)
        progress = Progress(arrays.rows)
        with _writing(open_writer(output, output_format, engine.outputs, batchable=engine.is_batchable)) as writer:
            for start, chunk in arrays.chunks(members, [layout.dtype for layout in layouts], size):
                writer.write(start, _chunk_outputs(engine, layouts, chunk, start))
                progress.tick(start + len(chunk[0]))
                del chunk  # else it lives on while the next chunk is read: two batches in memory
            output_bytes = writer.close()
        progress.finish(arrays.rows)
        return arrays.rows, 0, output_bytes, size


def _chunk_outputs(engine: Engine, layouts, chunk: list[np.ndarray], start: int) -> list[np.ndarray]:
    try:
        return run_rows(engine, layouts, chunk)
    except RunError as error:
        if len(chunk[0]) == 1:
            raise FormatError(f"row {start}: the model failed on it: {error.reason}") from None
    # Re-run row by row: either a row is at fault, and it is named, or the batch as a whole was.
    per_row = []
    for offset in range(len(chunk[0])):
        try:
            per_row.append(run_one(engine, layouts, [array[offset] for array in chunk]))
        except RunError as error:
            raise FormatError(f"row {start + offset}: the model failed on it: {error.reason}") from None
    return [np.stack([outputs[position] for outputs in per_row]) for position in range(len(engine.outputs))]


def _run_lines(engine: Engine, layouts: tuple[InputLayout, ...], input_path: Path, file_format: str,
               output: Path, batch_size: int) -> tuple[int, int, int]:
    if file_format == "csv":
        csv_layout(layouts)
        rows = csv_rows(input_path, layouts)
    else:
        require_numeric_inputs(layouts)
        rows = jsonl_rows(input_path, layouts)
    progress = Progress(count_lines(input_path))
    done = 0
    with _writing(open_writer(output, file_format, engine.outputs, batchable=engine.is_batchable)) as writer:
        for batch in group_rows(rows, batch_size, BATCH_BUDGET_BYTES):
            _write_batch(engine, layouts, batch, writer)
            done = batch[-1].index + 1
            progress.tick(done)
        errors = writer.errors
        output_bytes = writer.close()
    progress.finish(done)
    return done, errors, output_bytes


def _write_batch(engine: Engine, layouts, batch: list[Row], writer) -> None:
    if batch[0].feeds is None:
        writer.write_error(batch[0].index, batch[0].error)
        return
    try:
        writer.write(batch[0].index, run_rows(engine, layouts, stack_feeds(batch)))
        return
    except RunError:
        pass  # below, one row at a time, so that the error lands on the row at fault
    for row in batch:
        try:
            outputs = run_one(engine, layouts, row.feeds)
        except RunError as error:
            writer.write_error(row.index, f"line {row.line}: the model failed on this row: {error.reason}")
        else:
            writer.write(row.index, [output[np.newaxis] for output in outputs])
