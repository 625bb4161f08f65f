"""Writers of batch job outputs, one batch of rows at a time.

`.npy` and `.npz` headers hold the final shape. When the number of rows is known at the
start (an array input) and there is one `.npy` output, the header is written before the
first batch's rows, from that batch's row shape, and the rows go straight behind it.
Otherwise each output's rows go to a raw temporary file beside the output and are copied
behind their header when the job finishes (`.npz` member by member, zip64 always: an
output may pass 4 GiB). `.jsonl` is written line by line; `.csv` too, after its header, whose columns
come from the model's declared output shapes or, when those are dynamic, from the
first row that ran. Each writer builds `<output>.part` and renames it at the end, so a
stopped job never leaves a half file under the output's name.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from serving.engine import TensorSpec
from serving.jobs.formats import FormatError, short
from serving.jobs.protocol import finite
from serving.spreadsheet_cells import csv_cell

COPY_CHUNK_BYTES = 1024 * 1024


def output_format_for(input_format: str, output_count: int) -> str:
    """The spec's format family: .npy stays .npy only for a model with one output."""
    if input_format == "npy":
        return "npy" if output_count == 1 else "npz"
    return input_format


class RawRows:
    """One output's rows as raw C-order bytes in a file, shape checked as they come.

    By default the file is a temporary one, copied behind a header by `write_npy`. With
    `header_rows`, `file` is the output itself: the header for that many rows goes in
    before the first rows, and `finish_npy` checks that they all came."""

    def __init__(self, spec: TensorSpec, directory: Path, *, file=None, header_rows: int | None = None):
        self.spec = spec
        self.rows = 0
        self.dtype: np.dtype | None = None
        self.row_shape: tuple[int, ...] | None = None
        self._header_rows = header_rows
        self._file = file if file is not None else tempfile.TemporaryFile(dir=directory, prefix=".rows-")  # noqa: SIM115 (closed by close())

    def append(self, array: np.ndarray) -> None:
        name = short(self.spec.name)
        if array.dtype.hasobject:
            raise FormatError(f"output '{name}' holds strings, which .npy cannot hold without pickling; "
                              "send the input as .jsonl or .csv")
        if self.dtype is None:
            self.dtype, self.row_shape = array.dtype, array.shape[1:]
            if self._header_rows is not None:
                self._write_header(self._file, self._header_rows)
        elif array.shape[1:] != self.row_shape:
            raise FormatError(f"output '{name}' changed shape from {list(self.row_shape)} to {list(array.shape[1:])} "
                              "between batches; one array cannot hold both: send the input as .jsonl")
        # A flat byte view, not memoryview.cast("B"), which refuses an array of no values.
        self._file.write(np.ascontiguousarray(array, dtype=self.dtype).reshape(-1).view(np.uint8))
        self.rows += len(array)

    def _write_header(self, target, rows: int) -> None:
        dtype = self.dtype if self.dtype is not None else (self.spec.dtype or np.dtype(np.float32))
        row_shape = self.row_shape if self.row_shape is not None else tuple(dim or 0 for dim in self.spec.shape[1:])
        header = {"descr": npy_format.dtype_to_descr(dtype), "fortran_order": False, "shape": (rows, *row_shape)}
        if _needs_v2(header):
            npy_format.write_array_header_2_0(target, header)
        else:
            npy_format.write_array_header_1_0(target, header)

    def write_npy(self, target) -> None:
        self._write_header(target, self.rows)
        self._file.seek(0)
        shutil.copyfileobj(self._file, target, COPY_CHUNK_BYTES)

    def finish_npy(self) -> None:
        """The end of rows written behind their header: an empty output gets its header now."""
        if self.rows != self._header_rows:
            raise FormatError(f"output '{short(self.spec.name)}' has {self.rows} rows; the input has {self._header_rows}")
        if self.dtype is None:
            self._write_header(self._file, 0)

    def close(self) -> None:
        self._file.close()


def _needs_v2(header: dict) -> bool:
    return len(repr(header)) > 60_000  # version 1.0 headers stop at 65535 bytes


class _Part:
    """The output under construction, renamed into place by `commit`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.part = self.path.with_name(self.path.name + ".part")

    def commit(self) -> int:
        os.replace(self.part, self.path)
        return self.path.stat().st_size

    def discard(self) -> None:
        self.part.unlink(missing_ok=True)


class _TextPart(_Part):
    """A line-per-row output (`.jsonl`, `.csv`) written as it goes into its `.part` file."""

    def __init__(self, path: Path, newline: str | None = None):
        super().__init__(path)
        self.errors = 0
        self._file = open(self.part, "w", encoding="utf-8", newline=newline)  # noqa: SIM115 (closed by close/abort)

    def close(self) -> int:
        self._file.close()
        try:
            return self.commit()
        finally:
            self.discard()

    def abort(self) -> None:
        self._file.close()
        self.discard()


class NpyWriter(_Part):
    """`.npy` for one output, `.npz` (arrays named by output names) for several."""

    def __init__(self, path: Path, outputs: Sequence[TensorSpec], *, as_npz: bool, rows: int | None = None):
        super().__init__(path)
        self.as_npz = as_npz
        self._direct = None
        if not as_npz and rows is not None:
            # One write per batch, straight into the output: no temporary copy to make at the end.
            self._direct = open(self.part, "wb")  # noqa: SIM115 (closed by close/abort)
            self._raw = [RawRows(outputs[0], self.path.parent, file=self._direct, header_rows=rows)]
        else:
            self._raw = [RawRows(spec, self.path.parent) for spec in outputs]

    def write(self, start: int, outputs: Sequence[np.ndarray]) -> None:
        for raw, output in zip(self._raw, outputs):
            raw.append(output)

    def close(self) -> int:
        try:
            if self._direct is not None:
                self._raw[0].finish_npy()
                self._direct.close()
            elif self.as_npz:
                self._write_npz()
            else:
                with open(self.part, "wb") as target:
                    self._raw[0].write_npy(target)
            return self.commit()
        finally:
            self.discard()
            for raw in self._raw:
                raw.close()

    def _write_npz(self) -> None:
        with zipfile.ZipFile(self.part, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for raw in self._raw:
                with archive.open(f"{raw.spec.name}.npy", "w", force_zip64=True) as member:
                    raw.write_npy(member)

    def abort(self) -> None:
        self.discard()
        for raw in self._raw:
            raw.close()


def finite_rows(output: np.ndarray) -> np.ndarray:
    """Per row: whether every value is finite (JSON has no NaN or infinity)."""
    if output.dtype.kind != "f":
        return np.ones(len(output), dtype=bool)
    return np.isfinite(output.reshape(len(output), -1)).all(axis=1)


class JsonlWriter(_TextPart):
    """`{"row": i, "outputs": {name: value}}` or `{"row": i, "error": "..."}` per input row."""

    def __init__(self, path: Path, outputs: Sequence[TensorSpec]):
        super().__init__(path)
        self._names = [spec.name for spec in outputs]

    def write(self, start: int, outputs: Sequence[np.ndarray]) -> None:
        finite_by_output = [finite_rows(output) for output in outputs]
        for offset in range(len(outputs[0])):
            # Row by row: a whole batch as Python lists can be many times its size as an array.
            values = {name: output[offset].tolist() if is_finite[offset] else finite(output[offset].tolist())
                      for name, output, is_finite in zip(self._names, outputs, finite_by_output)}
            line = {"row": start + offset, "outputs": values}
            self._file.write(json.dumps(line, allow_nan=False, separators=(",", ":")) + "\n")

    def write_error(self, row: int, reason: str) -> None:
        self.errors += 1
        self._file.write(json.dumps({"row": row, "error": reason}, separators=(",", ":")) + "\n")


class CsvWriter(_TextPart):
    """Header `row,<output>[_k]...,error`: one column per value of each output, flattened."""

    def __init__(self, path: Path, outputs: Sequence[TensorSpec], *, batchable: bool):
        super().__init__(path, newline="")
        self._specs = list(outputs)
        # Without a batch axis the rows' shape is not the declared one (see serving/jobs/model.py).
        self._widths = [_declared_width(spec) if batchable else None for spec in outputs]
        self._waiting: list[tuple[int, str]] = []  # errors before the widths are known
        # Text quoted, numbers bare (written as the floats and ints they are): an output name
        # comes from the model file, an error may quote the client's field (serving/spreadsheet_cells.py).
        self._csv = csv.writer(self._file, quoting=csv.QUOTE_NONNUMERIC)
        if None not in self._widths:
            self._write_header()

    def _write_header(self) -> None:
        columns = ["row"]
        for spec, width in zip(self._specs, self._widths):
            columns += [spec.name] if width == 1 else [f"{spec.name}_{k}" for k in range(width)]
        self._csv.writerow([csv_cell(column) for column in [*columns, "error"]])

    def write(self, start: int, outputs: Sequence[np.ndarray]) -> None:
        flat = [output.reshape(len(output), -1) for output in outputs]
        if None in self._widths:
            self._widths = [width if width is not None else values.shape[1] for width, values in zip(self._widths, flat)]
            self._write_header()
            for row, reason in self._waiting:
                self._write_error_row(row, reason)
            self._waiting.clear()
        for offset in range(len(flat[0])):
            cells = [start + offset]
            for spec, width, values in zip(self._specs, self._widths, flat):
                row_values = values[offset]
                if len(row_values) != width:
                    self.write_error(start + offset, f"output '{short(spec.name)}' has {len(row_values)} values "
                                                     f"for this row; the header has {width} columns for it")
                    break
                if values.dtype.kind in "OSU":  # text a model answers (labels): as text a spreadsheet never runs
                    cells.extend(csv_cell(value) for value in row_values)
                else:
                    cells.extend(row_values)  # numbers: bare, written as str() writes them
            else:
                self._csv.writerow([*cells, ""])

    def write_error(self, row: int, reason: str) -> None:
        self.errors += 1
        if None in self._widths:
            self._waiting.append((row, reason))
        else:
            self._write_error_row(row, reason)

    def _write_error_row(self, row: int, reason: str) -> None:
        self._csv.writerow([row, *[""] * sum(self._widths), csv_cell(reason)])

    def close(self) -> int:
        if None in self._widths:  # no row ran: one column per output
            self._widths = [1 if width is None else width for width in self._widths]
            self._write_header()
            for row, reason in self._waiting:
                self._write_error_row(row, reason)
        return super().close()


def _declared_width(spec: TensorSpec) -> int | None:
    dims = spec.shape[1:]
    return math.prod(dims) if all(dim is not None for dim in dims) else None


def open_writer(path: Path, output_format: str, outputs: Sequence[TensorSpec], *, batchable: bool,
                rows: int | None = None):
    """`rows`: how many rows will be written, when known now (lets a `.npy` output skip its copy)."""
    if output_format in ("npy", "npz"):
        return NpyWriter(path, outputs, as_npz=output_format == "npz", rows=rows)
    if output_format == "jsonl":
        return JsonlWriter(path, outputs)
    return CsvWriter(path, outputs, batchable=batchable)

