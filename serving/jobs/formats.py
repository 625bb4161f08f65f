"""Streaming readers of job input files, and the cheap checks the console runs at upload.

A job file can be far larger than memory, so nothing here loads a whole file: a `.npy`
array is read a chunk of rows at a time with plain file reads after its header
(`np.load`, or a memory map, would leave every page it touched in the process's RSS),
the arrays of an `.npz` are zip member streams read in lockstep, `.jsonl` and `.csv`
one line at a time. Nothing is ever unpickled: an array of Python objects is refused.

Every problem is a `FormatError` whose `reason` is for people. In `.jsonl` and `.csv`
a bad line is a `RowError` on that row alone, so its neighbours still run.

Only numpy and the standard library: the console imports this module at upload time
(`check_batch_input`, `check_dataset`), where it must not pull in ONNX Runtime.
"""

from __future__ import annotations

import csv
import errno
import json
import lzma
import math
import struct
import tokenize
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self

import numpy as np
from numpy.lib import format as npy_format

from serving.jobs import labels
from serving.jobs.labels import LabelRule

ARRAY_FORMATS = ("npy", "npz")
ROW_FORMATS = ("jsonl", "csv")
BATCH_FORMATS = ARRAY_FORMATS + ROW_FORMATS
DATASET_FORMATS = ("npz", "jsonl")
LABELS_MEMBER = "labels"  # the array of answers in an .npz dataset
LABEL_KEY = "label"  # the answer of one .jsonl dataset row
NUMERIC_KINDS = "biuf"
LABEL_KINDS = NUMERIC_KINDS + "U"
MAX_HEADER_BYTES = 10_000
# An .npz file is read member by member only after its zip directory is bounded: an array
# per input of the model (and the labels of a data set), or MAX_NPZ_MEMBERS when the inputs
# are not known. A few more are tolerated until the names are read, so that a stray array
# is refused by its name; the directory may take MAX_ZIP_ENTRY_BYTES per member so tolerated.
MAX_NPZ_MEMBERS = 1024
NPZ_STRAY_MEMBERS = 64
MAX_ZIP_ENTRY_BYTES = 512
MAX_LINE_BYTES = 64 * 1024 * 1024
# The longest line one row can take as text, where the model's rows have a fixed size: each
# number with its separators and spaces (a float's repr is at most 24 characters), plus
# names, brackets and a label. A line past it cannot fit the model, and is refused before
# it is parsed: parsing a 40 MB line of numbers took 0.6-1.2 GB of the console's memory.
VALUE_TEXT_BYTES = 64
ROW_TEXT_SLACK_BYTES = 64 * 1024
MAX_SHOWN_CHARS = 60
READ_CHUNK_BYTES = 1024 * 1024
SKIP_CHUNK_BYTES = 64 * 1024  # the rest of a line too long to read, passed over


# What the standard library's zip reader and numpy's .npy header reader raise on hostile
# bytes, read in their source and found by mutating valid files (a fuzzer found each of the
# less obvious ones: a TokenError, an IndexError, a RecursionError from a header's literal,
# an OSError from a member offset before the file's start). `_reading` catches them around
# calls into those readers only, never around our own code, so a bug of ours still raises.
UNREADABLE_ERRORS = (
    zipfile.BadZipFile, zipfile.LargeZipFile,  # the archive's own checks
    NotImplementedError,  # a zip version, compression method or flag zipfile does not read
    RuntimeError,  # an encrypted member; a missing decompressor; RecursionError from a deep header literal
    EOFError, zlib.error, lzma.LZMAError,  # compressed data that is cut short or undecodable
    ValueError,  # numpy's header checks; an offset past what seek takes; a name that is not UTF-8
    SyntaxError, tokenize.TokenError,  # a header that is no Python literal
    TypeError, IndexError, OverflowError,  # a dtype description numpy cannot build
    struct.error,
)
# An OSError is the file's fault only without an errno (bz2's "Invalid data stream") or
# with EINVAL (a seek to an offset the directory put before the file's start); any other
# errno is the disk's, and ours to answer.
UNREADABLE_ERRNOS = (None, errno.EINVAL)


class FormatError(ValueError):
    """The file cannot be read, or does not fit the model; `reason` says why, for people."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class InputMismatch(FormatError):
    """The file is readable but does not fit the model's inputs (names, row shapes, types)."""


class RowError(ValueError):
    """One line of a .jsonl or .csv file is unusable; the others still run."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@contextmanager
def _reading(what: str, problem: str) -> Iterator[None]:
    """The zip and .npy readers' errors on the untrusted bytes read inside: a FormatError
    that says `what` `problem`, and the reader's words."""
    try:
        yield
    except OSError as error:
        if error.errno not in UNREADABLE_ERRNOS:
            raise
        raise FormatError(f"{what} {problem} ({short(error)})") from None
    except UNREADABLE_ERRORS as error:
        raise FormatError(f"{what} {problem} ({short(error)})") from None


def short(text: object) -> str:
    """A prefix of client-controlled text, safe to put in a reason."""
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


@dataclass(frozen=True, slots=True)
class InputLayout:
    """What one row of a model input looks like in a file.

    `row_shape` has None for a dynamic dimension. `stacked`: rows are fed stacked along
    a leading axis (a batch); else one row is the whole input (a model without one)."""

    name: str
    dtype: np.dtype | None  # None: a type the jobs cannot feed (strings)
    row_shape: tuple[int | None, ...]
    stacked: bool = True

    def describe(self) -> str:
        return shape_text(self.row_shape)

    @property
    def row_bytes_hint(self) -> int:
        itemsize = self.dtype.itemsize if self.dtype is not None else 8
        return itemsize * math.prod(dim or 1 for dim in self.row_shape)


def shape_text(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("any" if dim is None else str(dim) for dim in shape) + "]"


def fits(shape: Sequence[int], wanted: Sequence[int | None]) -> bool:
    return len(shape) == len(wanted) and all(want is None or want == got for got, want in zip(shape, wanted))


# KServe V2 datatype -> numpy, as serving.engine.V2_TO_NUMPY (which this module cannot import: ONNX Runtime)
V2_DTYPES = {name: np.dtype(numpy_name) for name, numpy_name in (
    ("BOOL", "bool"), ("UINT8", "uint8"), ("UINT16", "uint16"), ("UINT32", "uint32"), ("UINT64", "uint64"),
    ("INT8", "int8"), ("INT16", "int16"), ("INT32", "int32"), ("INT64", "int64"),
    ("FP16", "float16"), ("FP32", "float32"), ("FP64", "float64"))}


def input_layout(name: str, dtype: np.dtype | None, shape: Sequence[int | None], batchable: bool) -> InputLayout:
    """How a job feeds one input: rows along its first axis when the model is batchable
    or that axis is dynamic or 1, else one row is the whole input."""
    shape = tuple(shape)
    if batchable or (shape and shape[0] in (None, 1)):
        return InputLayout(name, dtype, shape[1:], stacked=True)
    return InputLayout(name, dtype, shape, stacked=False)


def signature_layouts(signature: object) -> tuple[InputLayout, ...] | None:
    """The layouts a job's child builds from the loaded model, from the inputs the console
    recorded at inspection (`{"name", "datatype", "shape"}`, a dynamic dimension a name or
    null); None when the signature records no inputs (nothing to check against)."""
    inputs = signature.get("inputs") if isinstance(signature, dict) else None
    if not isinstance(inputs, list) or not inputs:
        return None
    specs = [(spec["name"], V2_DTYPES.get(spec["datatype"]),
              tuple(dim if isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 else None for dim in spec["shape"]))
             for spec in inputs]
    batchable = all(shape and shape[0] is None for _, _, shape in specs)  # serving.engine.Engine.is_batchable
    return tuple(input_layout(name, dtype, shape, batchable) for name, dtype, shape in specs)


def describe_inputs(layouts: Sequence[InputLayout]) -> str:
    """What a model takes, for people: each input's name, row shape and type."""
    described = [f"'{short(layout.name)}' rows {layout.describe()} {layout.dtype if layout.dtype is not None else 'non-numeric'}"
                 for layout in layouts[:10]]
    return ", ".join(described) + (", ..." if len(layouts) > 10 else "")


def require_numeric_inputs(layouts: Sequence[InputLayout]) -> None:
    for layout in layouts:
        if layout.dtype is None:
            raise FormatError(f"input '{short(layout.name)}' is not a numeric tensor; jobs feed numeric inputs only")


# ---------------------------------------------------------------- .npy and .npz


@dataclass(frozen=True, slots=True)
class ArrayHeader:
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.row_shape)

    @property
    def data_bytes(self) -> int:
        return self.rows * self.row_bytes


def read_header(fp: IO[bytes], what: str, kinds: str = NUMERIC_KINDS) -> ArrayHeader:
    """The header of the .npy array at `fp`'s position, which is left at the data."""
    with _reading(what, "is not a readable .npy array"):
        version = npy_format.read_magic(fp)
        if version == (1, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_1_0(fp, max_header_size=MAX_HEADER_BYTES)
        elif version == (2, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_2_0(fp, max_header_size=MAX_HEADER_BYTES)
        else:
            shape = fortran_order = dtype = None
    if dtype is None:
        raise FormatError(f"{what} uses .npy format version {version[0]}.{version[1]}; versions 1.0 and 2.0 are read")
    _check_array_type(shape, fortran_order, dtype, what, kinds)
    return ArrayHeader(tuple(shape), dtype)


def _check_array_type(shape, fortran_order: bool, dtype: np.dtype, what: str, kinds: str) -> None:
    if dtype.hasobject:
        raise FormatError(f"{what} holds Python objects (a pickled array); only arrays of numbers are accepted")
    if dtype.names is not None or dtype.subdtype is not None or dtype.kind not in kinds:
        raise FormatError(f"{what} has dtype {short(dtype)}; only arrays of numbers are accepted")
    if len(shape) == 0:
        raise FormatError(f"{what} is a scalar; it needs a first axis of rows")
    if any(dim < 0 for dim in shape):  # numpy's header reader takes them: a job of -3 rows was a 500
        raise FormatError(f"{what} has shape {shape_text(shape)}, with a negative dimension")
    if dtype.itemsize == 0 or 0 in shape[1:]:
        # Only the data bounds a row count by the file's size: a 128-byte header declared
        # 10**18 rows of width 0, and its job held the jobs queue for minutes.
        raise FormatError(f"{what} has shape {shape_text(shape)} of {short(dtype)}: a row of it holds no bytes")
    if fortran_order and len(shape) > 1:
        raise FormatError(f"{what} is in Fortran order; save it in C order (numpy's default)")


class ArrayStream:
    """Rows of one array, read in order from a file object positioned at its data."""

    def __init__(self, fp: IO[bytes], header: ArrayHeader, what: str):
        self.header, self.what = header, what
        self._fp = fp

    def read(self, rows: int, dtype: np.dtype | None = None, into: bytearray | None = None) -> np.ndarray:
        """The next `rows` rows, as `dtype`; read into the start of `into` when given (the
        array is then a view of it, valid until it is reused), else into a new buffer."""
        count = rows * self.header.row_bytes
        # Filled in place: the rows exist once, in an array the caller may write to.
        data = bytearray(count) if into is None else memoryview(into)[:count]
        with _reading(self.what, "is corrupt"):
            filled = self._fp.readinto(data)
        if filled != count:
            raise FormatError(f"{self.what} is truncated: it ends inside its data")
        array = np.frombuffer(data, dtype=self.header.dtype).reshape((rows, *self.header.row_shape))
        wanted = dtype if dtype is not None else self.header.dtype.newbyteorder("=")
        return array if array.dtype == wanted else array.astype(wanted)


class ArrayFile:
    """A .npy or .npz file opened for streaming: named arrays that all have the same rows.

    The one array of a .npy file is named None. Headers are read, and sizes checked
    against the file, when it opens; data only when `chunks` asks.

    An .npz file's member names are read, and its members counted, before any member is
    opened: at most one per input of `inputs` (and `label_member`) when given, else
    MAX_NPZ_MEMBERS; given `inputs`, a member that is none of them is refused unopened."""

    def __init__(self, path: Path, file_format: str, *, label_member: str | None = None,
                 inputs: Sequence[InputLayout] | None = None):
        self._closing: list = []
        self.streams: dict[str | None, ArrayStream] = {}
        try:
            if file_format == "npy":
                self._open_npy(Path(path))
            else:
                self._open_npz(Path(path), label_member, inputs)
        except BaseException:
            self.close()
            raise
        self.rows = self._common_rows()

    def _open_npy(self, path: Path) -> None:
        fp = open(path, "rb")  # noqa: SIM115 (closed by close())
        self._closing.append(fp)
        header = read_header(fp, "the .npy file")
        if path.stat().st_size - fp.tell() < header.data_bytes:
            raise FormatError(f"the .npy file is truncated: its header promises {header.data_bytes} bytes of data, "
                              f"it holds {path.stat().st_size - fp.tell()}")
        self.streams[None] = ArrayStream(fp, header, "the .npy file")

    def _open_npz(self, path: Path, label_member: str | None, inputs: Sequence[InputLayout] | None) -> None:
        limit = NpzLimit.of(inputs, label_member)
        limit.check_directory(path)
        with _reading("the .npz file", "is not a readable zip archive"):
            archive = zipfile.ZipFile(path)
        self._closing.append(archive)
        entries = archive.infolist()
        limit.check_count(len(entries), limit.tolerated)  # a directory whose record understated its entries
        # Not ZipInfo.is_dir(): it indexes the name's last character, and a name may be empty.
        members = [info for info in entries if not info.filename.endswith("/")]
        if not members:
            raise FormatError("the .npz file holds no arrays")
        for info in members:
            if not info.filename.endswith(".npy"):
                raise FormatError(f"the .npz member '{short(info.filename)}' is not a .npy array")
        limit.check_names([info.filename.removesuffix(".npy") for info in members])
        limit.check_count(len(members), limit.allowed)
        for info in members:
            self._open_member(archive, info, info.filename.removesuffix(".npy"), label_member)

    def _open_member(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, label_member: str | None) -> None:
        what = f"the .npz array '{short(name)}'"
        if info.header_offset < 0:  # zipfile adds the end record's misplacement to every offset
            raise FormatError(f"{what} cannot be opened: the zip directory places it {-info.header_offset} bytes before the file's start")
        with _reading(what, "cannot be opened"):
            fp = archive.open(info)
        self._closing.append(fp)
        header = read_header(fp, what, LABEL_KINDS if name == label_member else NUMERIC_KINDS)
        if info.file_size - fp.tell() < header.data_bytes:
            raise FormatError(f"{what} is truncated: its header promises {header.data_bytes} bytes of data, "
                              f"it holds {info.file_size - fp.tell()}")
        self.streams[name] = ArrayStream(fp, header, what)

    def _common_rows(self) -> int:
        rows = {name: stream.header.rows for name, stream in self.streams.items()}
        if len(set(rows.values())) > 1:
            listed = ", ".join(f"'{short(name)}' {count}" for name, count in list(rows.items())[:10]) + (", ..." if len(rows) > 10 else "")
            raise FormatError(f"the .npz arrays have different numbers of rows ({listed}); they must match")
        return next(iter(rows.values()))

    def header(self, name: str | None) -> ArrayHeader:
        return self.streams[name].header

    def match_inputs(self, layouts: Sequence[InputLayout], *, extra: Sequence[str] = ()) -> list[str | None]:
        """The array for each input, in the model's order; FormatError when the file does not fit."""
        require_numeric_inputs(layouts)
        names = [layout.name for layout in layouts]
        if None in self.streams:
            if len(layouts) != 1:
                raise FormatError(f"a .npy file holds one array; this model has {len(layouts)} inputs "
                                  f"({_listed(names)}): use an .npz file with one array per input")
            members: list[str | None] = [None]
        else:
            unknown = sorted(set(self.streams) - set(names) - set(extra))
            if unknown:
                raise FormatError(f"the .npz array '{short(unknown[0])}' is not an input of the model "
                                  f"(its inputs: {_listed(names)})")
            missing = [name for name in [*names, *extra] if name not in self.streams]
            if missing:
                raise FormatError(f"the .npz file has no array '{short(missing[0])}' "
                                  f"(it has: {_listed(sorted(self.streams))})")
            members = list(names)
        for member, layout in zip(members, layouts):
            check_array(self.streams[member], layout)
        return members

    def chunks(self, members: Sequence[str | None], dtypes: Sequence[np.dtype | None],
               rows_per_chunk: int) -> Iterator[tuple[int, list[np.ndarray]]]:
        """(first row, [array per member]) for consecutive chunks of rows, read in lockstep."""
        for start in range(0, self.rows, rows_per_chunk):
            count = min(rows_per_chunk, self.rows - start)
            yield start, [self.streams[member].read(count, dtype) for member, dtype in zip(members, dtypes)]

    def close(self) -> None:
        for closable in reversed(self._closing):
            closable.close()
        self._closing.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class NpzLimit:
    """How many members an .npz file may have, checked before zipfile reads its directory
    (which it parses whole, into an object per entry) and before any member is opened."""

    names: tuple[str, ...] | None  # the arrays the file may hold; None: not known
    inputs: tuple[str, ...]  # the model's inputs among them
    feedable: bool  # every input numeric (else match_inputs refuses the model first)
    allowed: int
    what: str  # how many members may be there, and which, for people

    @classmethod
    def of(cls, inputs: Sequence[InputLayout] | None, label_member: str | None) -> NpzLimit:
        if inputs is None:
            return cls(None, (), True, MAX_NPZ_MEMBERS, f"at most {MAX_NPZ_MEMBERS} arrays")
        names = tuple(layout.name for layout in inputs)
        allowed = (*names, label_member) if label_member is not None else names
        count = len(set(allowed))
        and_labels = f" and '{short(label_member)}'" if label_member is not None else ""
        what = f"at most {count} (one array per input of the model{and_labels})"
        return cls(allowed, names, all(layout.dtype is not None for layout in inputs), count, what)

    @property
    def tolerated(self) -> int:
        return self.allowed + (NPZ_STRAY_MEMBERS if self.names is not None else 0)

    def refuse(self, reason: str) -> FormatError:
        # Given the model's inputs, too many arrays is the file not fitting the model.
        return InputMismatch(reason) if self.names is not None else FormatError(reason)

    def check_count(self, count: int, limit: int) -> None:
        if count > limit:
            raise self.refuse(f"the .npz file holds {count} members; it can hold {self.what}")

    def check_directory(self, path: Path) -> None:
        """The entries and size its end record gives the zip directory (the size is what
        zipfile reads and parses: every entry takes at least 46 bytes of it)."""
        try:
            with open(path, "rb") as fp:
                record = zipfile._EndRecData(fp)  # what zipfile.ZipFile itself reads the directory by
        except (OSError, zipfile.BadZipFile, EOFError, ValueError, struct.error, AttributeError):  # AttributeError: a
            record = None  # Python without these private names; zipfile still reads the file, unbounded as before
        if not record:
            return  # not a zip file: zipfile.ZipFile says so, as before
        self.check_count(record[zipfile._ECD_ENTRIES_TOTAL], self.tolerated)
        size, most = record[zipfile._ECD_SIZE], self.tolerated * MAX_ZIP_ENTRY_BYTES
        if size > most:
            raise self.refuse(f"the .npz file's zip directory takes {size} bytes, more than {most}: "
                              f"the file can hold {self.what}")

    def check_names(self, members: Sequence[str]) -> None:
        """A member that is no input of the model (nor the labels) is refused unopened, as
        `ArrayFile.match_inputs` would (after a model input the jobs cannot feed, as there)."""
        if self.names is None or not self.feedable:
            return
        unknown = sorted(set(members) - set(self.names))
        if unknown:
            raise InputMismatch(f"the .npz array '{short(unknown[0])}' is not an input of the model "
                                f"(its inputs: {_listed(self.inputs)})")


def check_array(stream: ArrayStream, layout: InputLayout) -> None:
    header = stream.header
    if not fits(header.row_shape, layout.row_shape):
        raise FormatError(f"{stream.what} has rows of shape {shape_text(header.row_shape)}; input "
                          f"'{short(layout.name)}' expects rows of shape {layout.describe()}")
    if not np.can_cast(header.dtype, layout.dtype, casting="same_kind"):
        raise FormatError(f"{stream.what} holds {header.dtype}; input '{short(layout.name)}' is {layout.dtype}, "
                          "and the values would change kind in the conversion")


def _listed(names: Sequence[str]) -> str:
    return ", ".join(f"'{short(name)}'" for name in names[:10]) + (", ..." if len(names) > 10 else "")


# ---------------------------------------------------------------- .jsonl and .csv


@dataclass(slots=True)
class Row:
    """One line of a row file: its feeds (a row array per input) or why it has none."""

    index: int  # 0-based, counting the data lines only
    line: int  # 1-based line number in the file
    feeds: tuple[np.ndarray, ...] | None
    error: str | None = None
    label: object = None


def count_lines(path: Path) -> int:
    """Lines in the file, counted in big chunks: a progress total, not a parse."""
    lines, last = 0, b"\n"
    with open(path, "rb") as fp:
        while chunk := fp.read(READ_CHUNK_BYTES):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def row_text_bytes(layouts: Sequence[InputLayout] | None, *, with_label: bool = False) -> int:
    """The longest line a row of ``layouts`` can take (a label as large as the inputs
    beside it); MAX_LINE_BYTES when they are not known or a row's size is not fixed."""
    if layouts is None or any(dim is None for layout in layouts for dim in layout.row_shape):
        return MAX_LINE_BYTES
    values = sum(math.prod(layout.row_shape) for layout in layouts) * (2 if with_label else 1)
    return min(VALUE_TEXT_BYTES * values + ROW_TEXT_SLACK_BYTES, MAX_LINE_BYTES)


def line_too_long(line: int, max_size: int, unit: str = "bytes") -> str:
    if max_size == MAX_LINE_BYTES:
        return f"line {line} is longer than {MAX_LINE_BYTES} {unit}"
    return f"line {line} is longer than {max_size} {unit}, more than a row of the model's inputs takes as text"


def _too_long(line: int, max_size: int, unit: str = "bytes") -> FormatError:
    """Past the model's own bound, the file does not fit the model (an InputMismatch)."""
    kind = FormatError if max_size == MAX_LINE_BYTES else InputMismatch
    return kind(line_too_long(line, max_size, unit))


def _lines(fp: IO[bytes], max_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) of each non-blank line; bytes None for a line longer than
    ``max_bytes`` (read past, never held)."""
    number = 0
    while line := fp.readline(max_bytes + 1):
        number += 1
        if len(line) > max_bytes:
            while (rest := fp.readline(SKIP_CHUNK_BYTES)) and not rest.endswith(b"\n"):
                pass
            yield number, None
        elif line.strip():
            yield number, line


def row_array(value: object, layout: InputLayout) -> np.ndarray:
    """One row of `layout`'s input from a JSON value (nested lists of numbers)."""
    name = short(layout.name)
    try:
        array = np.asarray(value)
    except (ValueError, OverflowError, TypeError):
        raise RowError(f"input '{name}' is not a rectangular array of numbers") from None
    if array.dtype.kind not in NUMERIC_KINDS:
        raise RowError(f"input '{name}' holds something other than numbers")
    if not fits(array.shape, layout.row_shape):
        raise RowError(f"input '{name}' has shape {shape_text(array.shape)}; the model expects {layout.describe()}")
    if array.size == 0:  # as in an array file: a model fed no values fails, or answers nothing to write
        raise RowError(f"input '{name}' has shape {shape_text(array.shape)}: a row of it holds no values")
    if not np.can_cast(array.dtype, layout.dtype, casting="same_kind"):
        raise RowError(f"input '{name}' holds {array.dtype} values; the model expects {layout.dtype}")
    return array.astype(layout.dtype, copy=False)


def parse_jsonl_row(text: bytes, layouts: Sequence[InputLayout], *, with_label: bool = False):
    """(feeds, label) of one .jsonl line; RowError when it does not fit the model."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise RowError("the line is not valid JSON") from None
    return jsonl_feeds(value, layouts, with_label=with_label)


def jsonl_feeds(value: object, layouts: Sequence[InputLayout], *, with_label: bool = False):
    """(feeds, label) of one parsed .jsonl line; RowError when it does not fit the model."""
    names = [layout.name for layout in layouts]
    if not isinstance(value, dict) and len(layouts) == 1 and not with_label:
        value = {names[0]: value}  # a bare value feeds a model with one input
    if not isinstance(value, dict):
        raise RowError("the line is not a JSON object keyed by input names")
    label = None
    if with_label:
        if LABEL_KEY not in value:
            raise RowError(f"the line has no '{LABEL_KEY}'")
        label = value.pop(LABEL_KEY)
    unknown = [key for key in value if key not in names]
    if unknown:
        raise RowError(f"'{short(unknown[0])}' is not an input of the model (its inputs: {_listed(names)})")
    missing = [name for name in names if name not in value]
    if missing:
        raise RowError(f"the line has no value for input '{short(missing[0])}'")
    return tuple(row_array(value[layout.name], layout) for layout in layouts), label


def jsonl_rows(path: Path, layouts: Sequence[InputLayout], *, with_label: bool = False) -> Iterator[Row]:
    require_numeric_inputs(layouts)
    max_bytes = row_text_bytes(layouts, with_label=with_label)
    with open(path, "rb") as fp:
        for index, (line, text) in enumerate(_lines(fp, max_bytes)):
            if text is None:
                yield Row(index, line, None, line_too_long(line, max_bytes))
                continue
            try:
                feeds, label = parse_jsonl_row(text, layouts, with_label=with_label)
            except RowError as error:
                yield Row(index, line, None, f"line {line}: {error.reason}")
            else:
                yield Row(index, line, feeds, label=label)


def group_rows(rows: Iterator[Row], max_rows: int, max_bytes: int) -> Iterator[list[Row]]:
    """Consecutive good rows of one shape, as batches; a bad row alone, in its place."""
    batch: list[Row] = []
    batch_bytes = 0
    for row in rows:
        if batch and (row.feeds is None or len(batch) >= max_rows or batch_bytes >= max_bytes
                      or _shapes(row) != _shapes(batch[0])):
            yield batch
            batch, batch_bytes = [], 0
        if row.feeds is None:
            yield [row]
            continue
        batch.append(row)
        batch_bytes += sum(feed.nbytes for feed in row.feeds)
    if batch:
        yield batch


def _shapes(row: Row) -> tuple:
    return tuple(feed.shape for feed in row.feeds)


def stack_feeds(batch: Sequence[Row]) -> list[np.ndarray]:
    return [np.stack([row.feeds[position] for row in batch]) for position in range(len(batch[0].feeds))]


def csv_layout(layouts: Sequence[InputLayout]) -> InputLayout:
    """The one input a .csv file can feed: rows of a single feature axis."""
    if len(layouts) != 1 or len(layouts[0].row_shape) != 1:
        shapes = ", ".join(f"'{short(layout.name)}' rows {layout.describe()}" for layout in layouts)
        raise FormatError("a .csv file feeds models with one input of shape [batch, features]; "
                          f"this model has {shapes}: use .jsonl or .npz")
    require_numeric_inputs(layouts)
    return layouts[0]


def parse_csv_fields(fields: Sequence[str], layout: InputLayout) -> np.ndarray:
    width = layout.row_shape[0]
    if width is not None and len(fields) != width:
        raise RowError(f"the row has {len(fields)} values; input '{short(layout.name)}' expects {width}")
    integral = layout.dtype.kind in "biu"
    convert = int if integral else float
    values = []
    for position, field in enumerate(fields, start=1):
        try:
            values.append(convert(_ascii_number(field)))
        except ValueError:
            kind = "an integer" if integral else "a number"
            raise RowError(f"field {position} ('{short(field)}') is not {kind}") from None
    try:
        return np.array(values, dtype=layout.dtype)
    except OverflowError:
        raise RowError(f"a value does not fit input '{short(layout.name)}' ({layout.dtype})") from None


def _ascii_number(field: str) -> str:
    """``field`` when it is written as a number is in a .csv file: Python's int() and float()
    also read other scripts' digits ('١٠' is 10) and underscores ('1_0' is 10), which no
    spreadsheet writes, and a typo read as a number is an answer on the wrong input."""
    if not field.isascii() or "_" in field:
        raise ValueError(field)
    return field


def _is_numeric_record(fields: Sequence[str]) -> bool:
    try:
        [float(_ascii_number(field)) for field in fields]
    except ValueError:
        return False
    return bool(fields)


def _csv_records(path: Path, max_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each non-empty record; FormatError at a line longer than
    ``max_bytes``, before the csv module splits it."""
    # Undecodable bytes become U+FFFD and then fail as a value of their own row only. A BOM
    # (Excel's "CSV UTF-8" writes one) is not text: read into the first value, that row was
    # taken for a header and dropped, the output one row short and shifted.
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as fp:
        reader = csv.reader(_bounded_text_lines(fp, max_bytes))
        try:
            for fields in reader:
                if any(field.strip() for field in fields):
                    yield reader.line_num, fields
        except csv.Error as error:
            raise FormatError(f"the .csv file cannot be parsed at line {reader.line_num} ({short(error)})") from None


def _bounded_text_lines(fp: IO[str], max_chars: int) -> Iterator[str]:
    number = 0
    while line := fp.readline(max_chars + 1):
        number += 1
        if len(line) > max_chars:
            raise _too_long(number, max_chars, unit="characters")
        yield line


def csv_rows(path: Path, layouts: Sequence[InputLayout]) -> Iterator[Row]:
    """Rows of a .csv file; a first record that is not all numbers is a header, skipped."""
    layout = csv_layout(layouts)
    index = 0
    for position, (line, fields) in enumerate(_csv_records(path, row_text_bytes([layout]))):
        if position == 0 and not _is_numeric_record(fields):
            continue
        try:
            yield Row(index, line, (parse_csv_fields(fields, layout),))
        except RowError as error:
            yield Row(index, line, None, f"line {line}: {error.reason}")
        index += 1


# ---------------------------------------------------------------- upload-time checks


@contextmanager
def _fitting(line: int | None = None) -> Iterator[None]:
    """Problems raised inside are the file not fitting the model: an InputMismatch."""
    try:
        yield
    except RowError as error:
        raise InputMismatch(f"line {line}: {error.reason}" if line is not None else error.reason) from None
    except FormatError as error:
        raise InputMismatch(error.reason) from None


def check_batch_input(path: Path, file_format: str, layouts: Sequence[InputLayout] | None = None) -> int | None:
    """Refuse a batch input that cannot be read, or (given the layouts of the version it
    runs on) does not fit that model, before a job is queued for it.

    Cheap: headers for .npy/.npz (returns their rows), the first record for .jsonl and
    .csv (returns None: later bad lines are per-row errors of the job)."""
    path = Path(path)
    if file_format in ARRAY_FORMATS:
        with ArrayFile(path, file_format, inputs=layouts) as arrays:
            if layouts is not None:
                with _fitting():
                    arrays.match_inputs(layouts)
            return arrays.rows
    if file_format == "jsonl":
        line, value = _check_first_jsonl_line(path, row_text_bytes(layouts))
        if layouts is not None:
            with _fitting(line):
                require_numeric_inputs(layouts)
                jsonl_feeds(value, layouts)
        return None
    if file_format == "csv":
        if layouts is not None:
            with _fitting():
                layout = csv_layout(layouts)
        line, fields = _check_first_csv_record(path, row_text_bytes([layout]) if layouts is not None else MAX_LINE_BYTES)
        if layouts is not None:
            with _fitting(line):
                parse_csv_fields(fields, layout)
        return None
    raise FormatError(f"'{short(file_format)}' is not a batch input format ({', '.join(BATCH_FORMATS)})")


def _check_first_jsonl_line(path: Path, max_bytes: int) -> tuple[int, object]:
    with open(path, "rb") as fp:
        line, text = next(_lines(fp, max_bytes), (0, b""))
    if not text:
        if line == 0:
            raise FormatError("the .jsonl file has no rows")
        raise _too_long(line, max_bytes)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise FormatError(f"line {line} is not valid JSON") from None
    if not isinstance(value, dict | list):
        raise FormatError(f"line {line} is not a JSON object (or list) of inputs")
    return line, value


def _check_first_csv_record(path: Path, max_bytes: int) -> tuple[int, list[str]]:
    records = _csv_records(path, max_bytes)
    first = next(records, None)
    if first is not None and not _is_numeric_record(first[1]):
        first = next(records, None)
    if first is None:
        raise FormatError("the .csv file has no rows")
    if not _is_numeric_record(first[1]):
        raise FormatError(f"line {first[0]} of the .csv file is not a row of numbers")
    return first


def check_dataset(path: Path, file_format: str, layouts: Sequence[InputLayout] | None = None, rule: LabelRule = LabelRule()) -> int:
    """The number of rows of an evaluation dataset; FormatError when it cannot be used,
    InputMismatch when it does not fit the model of `layouts` (when given).

    `.npz`: a `labels` array (one label per row) beside the input arrays. `.jsonl`:
    every line an object with a `label` (a number, a string or a list of numbers). Every
    label must be one the evaluation can score under `rule` (`serving.jobs.labels`)."""
    path = Path(path)
    if file_format == "npz":
        return _check_npz_dataset(path, layouts, rule)
    if file_format == "jsonl":
        return _check_jsonl_dataset(path, layouts, rule)
    raise FormatError(f"'{short(file_format)}' is not a dataset format ({', '.join(DATASET_FORMATS)})")


def _check_npz_labels(stream: ArrayStream, rows: int, rule: LabelRule) -> None:
    header = stream.header
    problem = labels.header_problem(header.dtype, header.row_shape, rule, header.data_bytes)
    if problem is not None:
        raise FormatError(f"the .npz array '{LABELS_MEMBER}' has dtype {short(header.dtype)} and shape {shape_text(header.shape)}: {problem}")
    if not labels.reads_rows(header.dtype, rule):
        return
    step = labels.rows_per_check(header.row_bytes)
    for first in range(0, rows, step):
        chunk = stream.read(min(step, rows - first))
        found = labels.chunk_problem(chunk, rule)
        if found is not None:
            row, words = found
            raise FormatError(f"row {first + row}: {words}, not {short(chunk[row].tolist())}")


def _check_npz_dataset(path: Path, layouts: Sequence[InputLayout] | None, rule: LabelRule) -> int:
    with ArrayFile(path, "npz", label_member=LABELS_MEMBER, inputs=layouts) as arrays:
        if LABELS_MEMBER not in arrays.streams:
            raise FormatError(f"the .npz dataset has no '{LABELS_MEMBER}' array")
        if len(arrays.streams) < 2:
            raise FormatError(f"the .npz dataset has no input arrays beside '{LABELS_MEMBER}'")
        if arrays.rows == 0:
            raise FormatError("the .npz dataset has no rows")
        if layouts is not None:
            with _fitting():
                arrays.match_inputs(layouts, extra=(LABELS_MEMBER,))
        _check_npz_labels(arrays.streams[LABELS_MEMBER], arrays.rows, rule)
        return arrays.rows


def _check_jsonl_dataset(path: Path, layouts: Sequence[InputLayout] | None, rule: LabelRule) -> int:
    if layouts is not None:
        with _fitting():
            require_numeric_inputs(layouts)
    rows, max_bytes = 0, row_text_bytes(layouts, with_label=True)
    with open(path, "rb") as fp:
        for line, text in _lines(fp, max_bytes):
            if text is None:
                raise _too_long(line, max_bytes)
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                raise FormatError(f"line {line} is not valid JSON") from None
            if not isinstance(value, dict) or LABEL_KEY not in value:
                raise FormatError(f"line {line} is not a JSON object with a '{LABEL_KEY}'")
            label = value[LABEL_KEY]
            problem = labels.value_problem(label, rule) if is_label(label) else "the label is not a number, a string or a list of numbers"
            if problem is not None:
                raise FormatError(f"line {line}: {problem}, not {short(json.dumps(label))}")
            rule = rule.after(label)
            if layouts is not None:
                # Any row that does not fit fails the whole evaluation, so every row is checked.
                with _fitting(line):
                    jsonl_feeds(value, layouts, with_label=True)
            rows += 1
    if rows == 0:
        raise FormatError("the .jsonl dataset has no rows")
    return rows


def is_label(value: object) -> bool:
    if isinstance(value, list):
        return bool(value) and all(isinstance(item, int | float) and not isinstance(item, bool) for item in value)
    return isinstance(value, int | float | str) and not isinstance(value, bool)
