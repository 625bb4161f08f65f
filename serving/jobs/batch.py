"""The batch command: run a model over every row of a file, streaming, into an output file.

Memory is bounded by the byte budget, not the file. In `.npy` and `.npz` the model runs
--batch-size rows at a time (fewer when a batch would pass its share of
BATCH_BUDGET_BYTES), while a reader thread fills the next chunk of whole batches and a
writer thread writes the previous chunk's outputs (serving/jobs/pipeline.py): for a small
model, reading and writing cost as much as running. The input lives in INPUT_BUFFERS
buffers, filled in place and reused, which together stay within BATCH_BUDGET_BYTES (plus
a converted copy where the file's dtype is not the model's); the outputs of at most three
chunks exist at once (being written, waiting, being made). `.jsonl` and `.csv` are read a
batch at a time in the job's own thread; each
line is checked before it joins a batch, and a batch that fails is re-run one row at a
time, so a bad row gets its own error and its neighbours their outputs. In `.npy` and
`.npz` there is no place for a row's error: the first failing row fails the job, named.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
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
from serving.jobs.pipeline import Drain, Prefetch, get_unless
from serving.jobs.protocol import Progress, peak_rss_bytes
from serving.jobs.writers import open_writer, output_format_for

# Input buffers in rotation: one the model runs on, one the reader fills next. More would only
# add memory; the reader already keeps a chunk ahead whenever reading is faster than running.
INPUT_BUFFERS = 2
# Rows are read, and outputs handed to the writer, a chunk of whole batches at a time: waking
# another thread costs tens of microseconds, as much as running a small batch of a small model.
# The model still runs one --batch-size batch at a time.
READ_CHUNK_BYTES = 4 * 1024 * 1024


def run(model: Path | bytes, input_path: Path, file_format: str, output: Path, batch_size: int) -> dict:
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
    with ArrayFile(input_path, file_format, inputs=layouts) as arrays:
        members = arrays.match_inputs(layouts)
        row_bytes = sum(max(arrays.header(member).row_bytes, layout.row_bytes_hint)
                        for member, layout in zip(members, layouts))
        size = rows_per_batch(batch_size, row_bytes, INPUT_BUFFERS)
        chunk_rows = size * max(1, min(READ_CHUNK_BYTES, BATCH_BUDGET_BYTES // INPUT_BUFFERS) // (size * row_bytes))
        progress = Progress(arrays.rows)
        # Every buffer at once, before any read: the memory a job needs is taken at the start, not midway.
        free: queue.Queue = queue.Queue()
        for _ in range(INPUT_BUFFERS):
            free.put([bytearray(chunk_rows * arrays.header(member).row_bytes) for member in members])
        reading = partial(_read_chunks, arrays, members, [layout.dtype for layout in layouts], chunk_rows, free)
        writer = open_writer(output, output_format, engine.outputs, batchable=engine.is_batchable, rows=arrays.rows)

        def write(batches: list[tuple[int, list[np.ndarray]]]) -> None:
            for start, outputs in batches:
                writer.write(start, outputs)
            progress.tick(start + len(outputs[0]))

        with _writing(writer):
            with Prefetch(reading) as chunks, Drain(write) as drain:
                for start, chunk, buffers in chunks:
                    batches = _run_chunk(engine, layouts, chunk, start, size, buffers)
                    del chunk  # the rows are the buffers' now, which the reader refills
                    free.put(buffers)
                    drain.put(batches)
                    del batches
            output_bytes = writer.close()
        progress.finish(arrays.rows)
        return arrays.rows, 0, output_bytes, size


def _read_chunks(arrays: ArrayFile, members, dtypes, rows: int, free: queue.Queue,
                 stopping: threading.Event) -> Iterator[tuple[int, list[np.ndarray], list[bytearray]]]:
    """(first row, [array per member], the buffers they are views of): each chunk waits for free buffers."""
    for start in range(0, arrays.rows, rows):
        buffers = get_unless(free, stopping)
        if buffers is None:
            return
        count = min(rows, arrays.rows - start)
        yield start, [arrays.streams[member].read(count, dtype, into=buffer)
                      for member, dtype, buffer in zip(members, dtypes, buffers)], buffers


def _run_chunk(engine: Engine, layouts, chunk: list[np.ndarray], start: int, size: int,
               buffers: list[bytearray]) -> list[tuple[int, list[np.ndarray]]]:
    """(first row, outputs) of each batch of `size` rows of the chunk, in order."""
    batches = []
    for offset in range(0, len(chunk[0]), size):
        outputs = _chunk_outputs(engine, layouts, [array[offset:offset + size] for array in chunk], start + offset)
        batches.append((start + offset, _unshared(outputs, buffers)))
    return batches


def _unshared(outputs: list[np.ndarray], buffers: list[bytearray]) -> list[np.ndarray]:
    """The outputs, copied where one is a view of an input buffer (an output that is an input,
    or a slice of one): the reader refills that buffer while the outputs wait to be written."""
    views = [np.frombuffer(buffer, np.uint8) for buffer in buffers]
    return [output.copy() if any(np.may_share_memory(output, view) for view in views) else output
            for output in outputs]


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
