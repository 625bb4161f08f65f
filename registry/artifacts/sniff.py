"""A cheap look at an upload's bytes, so what is plainly not ONNX is refused at once.

The real inspection (``inspection.py``) runs later, in a job. This walk reads only the
top-level field headers of the protobuf (a tag, and a length it skips), never a payload,
so it costs microseconds for a 2 GB model. It refuses only what the inspection's first
step would refuse too: bytes that are not a well-formed protobuf message at the top level
(random bytes, text, a file cut short inside a field), or a message with no graph or no
IR version (``inspection._parse_model``'s "no IR version or no graph"). Anything else,
however odd, goes on to the inspection.
"""

from __future__ import annotations

import os
from typing import BinaryIO

# ModelProto's field numbers (onnx.proto): ir_version = 1 (int64), graph = 7 (message).
IR_VERSION_FIELD = 1
GRAPH_FIELD = 7
VARINT, FIXED64, LENGTH_DELIMITED, START_GROUP, END_GROUP, FIXED32 = range(6)
FIXED_SIZES = {FIXED64: 8, FIXED32: 4}
MAX_VARINT_BYTES = 10
# A real model has a dozen top-level fields (hundreds with many metadata entries or
# functions); past this many the walk stops judging and leaves it to the inspection.
MAX_FIELDS_WALKED = 10_000
NOT_ONNX = "the file is not an ONNX model"


class _Malformed(Exception):
    pass


def not_onnx_reason(path: str | os.PathLike) -> str | None:
    """Why the file at ``path`` is certainly not an ONNX model, or None when it may be one."""
    size_bytes = os.path.getsize(path)
    if size_bytes == 0:
        return "the artifact is empty"
    with open(path, "rb") as source:
        try:
            fields = _top_level_fields(source, size_bytes)
        except _Malformed as problem:
            return f"{NOT_ONNX}: {problem}"
    if fields is None:  # too many fields to walk cheaply: not judged here
        return None
    if not fields.get(GRAPH_FIELD) or not fields.get(IR_VERSION_FIELD):
        return f"{NOT_ONNX}: it has no IR version or no graph"
    return None


def _top_level_fields(source: BinaryIO, size_bytes: int) -> dict[int, int] | None:
    """{field number: the IR version's last value, or 1 for a graph seen} of a message
    that is well formed at the top level; None past MAX_FIELDS_WALKED fields."""
    seen: dict[int, int] = {}
    for _ in range(MAX_FIELDS_WALKED):
        offset = source.tell()
        if offset == size_bytes:
            return seen
        tag = _varint(source, "a field tag")
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise _Malformed(f"it is not a protobuf message (field number 0 at byte {offset})")
        value = _skip_value(source, wire_type, offset, size_bytes)
        if number == IR_VERSION_FIELD and wire_type == VARINT:
            seen[IR_VERSION_FIELD] = value  # the last one wins, as when parsing
        elif number == GRAPH_FIELD and wire_type == LENGTH_DELIMITED:
            seen[GRAPH_FIELD] = 1
    return None


def _skip_value(source: BinaryIO, wire_type: int, offset: int, size_bytes: int) -> int:
    """Step over one field's value; returns it for a varint."""
    if wire_type == VARINT:
        return _varint(source, "a number")
    if wire_type == LENGTH_DELIMITED:
        length = _varint(source, "a length")
        end = source.tell() + length
    elif wire_type in FIXED_SIZES:
        end = source.tell() + FIXED_SIZES[wire_type]
    else:
        # Groups are deprecated protobuf no ONNX writer emits; 6 and 7 do not exist.
        raise _Malformed(f"it is not a protobuf message (wire type {wire_type} at byte {offset})")
    if end > size_bytes:
        raise _Malformed(f"it is cut short: a field at byte {offset} needs {end - size_bytes} more bytes than the file has")
    source.seek(end)
    return 0


def _varint(source: BinaryIO, what: str) -> int:
    value = 0
    for index in range(MAX_VARINT_BYTES):
        byte = source.read(1)
        if not byte:
            raise _Malformed(f"it is cut short inside {what}")
        value |= (byte[0] & 0x7F) << (7 * index)
        if byte[0] < 0x80:
            return value
    raise _Malformed(f"it is not a protobuf message ({what} longer than {MAX_VARINT_BYTES} bytes)")
