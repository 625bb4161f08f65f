"""What every process that loads a model file checks and arranges first.

An ONNX tensor may say its bytes live in another file (``data_location = EXTERNAL``,
``external_data = [{location: ...}]``). ONNX Runtime then opens that path relative to
the loading process's working directory, and a model that names ``var/secret_key``
serves the secret's bytes to whoever calls it. Tensors live in many places of the
protobuf (graph initializers, node attributes, subgraphs at any depth, model-local
functions and their attribute defaults, sparse initializers, training info, and
whatever a later ONNX release adds), so ``external_references`` walks every message
field generically instead of naming the places: a tensor anywhere is seen.

The registry's inspection child and every serving worker call ``check_model_bytes``
before ONNX Runtime sees the bytes: the worker does not trust that the console
inspected what it is told to load. Both also run from an empty private working
directory (``enter_private_working_directory``), and the data directory defaults to
a place outside the code tree (``default_data_dir``), so even a check that missed a
reference would find nothing to read.

A stored file can be rewritten after its upload by whoever may write the store. The
job children and the inspection child are handed it opened (never through a link) and
``read_checked`` it against the sha256 recorded at upload: an evaluation, a benchmark
or a verdict describes the version's own bytes or none.

Imports no Django, and imports onnx only when it parses (console settings use
``default_data_dir``).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import BinaryIO

from serving.env import env_str, home_expanded

TENSOR = "onnx.TensorProto"
# Nodes that ONNX Runtime resolves to a file of their own (EPContext with
# embed_mode=0 names a compiled context file next to the model).
FILE_NODE_TYPES = frozenset({"EPContext"})
MAX_LOCATION_CHARS = 80
# ONNX Runtime reads bytes carrying this flatbuffer identifier at offset 4 as its own ORT
# format, whatever they also parse as: what was checked would not be what runs.
ORT_FORMAT_ID = b"ORTM"


class UnsafeModel(ValueError):
    """The bytes must not reach ONNX Runtime; ``reason`` says why, for people."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------- the walk


@cache
def _message_fields(descriptor) -> tuple:
    """(name, is_repeated, is_map) of each message-typed field: scalars and bytes are
    never read, so a walk over a 2 GB model copies no tensor data."""
    fields = []
    for field in descriptor.fields:
        if field.type == field.TYPE_MESSAGE:
            is_map = field.message_type.GetOptions().map_entry
            fields.append((field.name, field.is_repeated, is_map))
    return tuple(fields)


def walk_messages(root) -> Iterator:
    """Every message nested in ``root`` (``root`` included), through every field.

    An explicit stack, not recursion: subgraphs nest as deep as protobuf allows.
    """
    stack = [root]
    while stack:
        message = stack.pop()
        yield message
        for name, is_repeated, is_map in _message_fields(message.DESCRIPTOR):
            if is_map:
                stack.extend(getattr(message, name).values())
            elif is_repeated:
                stack.extend(getattr(message, name))
            elif message.HasField(name):
                stack.append(getattr(message, name))


def _unknown_field_count(message) -> int:
    from google.protobuf import unknown_fields

    return len(unknown_fields.UnknownFieldSet(message))


def external_references(model) -> Iterator[tuple[str, str]]:
    """(tensor name, location) of every tensor that points outside the file."""
    for message in walk_messages(model):
        if message.DESCRIPTOR.full_name != TENSOR:
            continue
        if message.data_location == message.EXTERNAL or len(message.external_data):
            location = next((entry.value for entry in message.external_data if entry.key == "location"), "")
            yield message.name, location


def refuse_external_references(model) -> None:
    """Raise UnsafeModel for the first tensor, file-backed node or unknown field found."""
    for message in walk_messages(model):
        kind = message.DESCRIPTOR.full_name
        if kind == TENSOR and (message.data_location == message.EXTERNAL or len(message.external_data)):
            raise UnsafeModel(_external_reason(message))
        if kind == "onnx.NodeProto" and message.op_type in FILE_NODE_TYPES:
            raise UnsafeModel(f"node '{_short(message.name)}' ({message.op_type}) refers to a file outside the model; "
                              "such nodes are not accepted")
        if _unknown_field_count(message):
            # A field this ONNX version does not know could be a place a newer
            # ONNX Runtime reads a tensor from; it cannot be checked, so refuse it.
            raise UnsafeModel(f"the model has fields unknown to ONNX {_onnx_version()} (in a {kind}); "
                              "export it with a released ONNX version")


def _external_reason(tensor) -> str:
    location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
    return (f"tensor '{_short(tensor.name)}' points at external data '{_short(location)}'; external data files "
            "are not accepted, store every tensor inside the .onnx file")


def _short(text: str) -> str:
    return text if len(text) <= MAX_LOCATION_CHARS else text[: MAX_LOCATION_CHARS - 3] + "..."


def _onnx_version() -> str:
    import onnx

    return onnx.__version__


def parse_model(data: bytes):
    """The ModelProto in ``data``; UnsafeModel when it is not a readable protobuf."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        # Always binary protobuf: onnx.load would guess a text format from a name.
        return onnx.load_model_from_string(data, format="protobuf")
    except (DecodeError, RuntimeError, ValueError) as error:
        # Refused, not passed on: bytes our parser cannot read are bytes we did not check.
        raise UnsafeModel(f"not a readable ONNX model ({_short(' '.join(str(error).split()))})") from None


def check_model_bytes(data: bytes) -> None:
    """Raise UnsafeModel unless ``data`` is an ONNX model whose every tensor is inside it."""
    if data[4:8] == ORT_FORMAT_ID:
        raise UnsafeModel("ONNX Runtime would read this file as its ORT format (ORTM at byte 4), not as the ONNX model checked: "
                          "upload the .onnx file")
    refuse_external_references(parse_model(data))


def read_checked(source: BinaryIO, sha256: str, what: str) -> bytes:
    """All of ``source``, when its bytes have the ``sha256`` they were recorded with; else
    UnsafeModel naming ``what``. Read once: the bytes returned are the ones to load, as a
    file read again after its check may have been rewritten in between."""
    data = source.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise UnsafeModel(f"{what} does not match its sha256 {sha256[:12]}… (its bytes hash to {digest[:12]}…): "
                          "the file changed after its upload; nothing was run on it")
    return data


# ---------------------------------------------------------------- where processes run


def default_data_dir() -> Path:
    """``$DATA_DIR``, else ``$XDG_DATA_HOME/modelops`` (``~/.local/share/modelops``):
    never inside the code tree or relative to a model-loading process's cwd."""
    explicit = env_str("DATA_DIR")
    if explicit:
        return home_expanded("DATA_DIR", explicit).resolve()
    base = env_str("XDG_DATA_HOME")
    return ((home_expanded("XDG_DATA_HOME", base) if base else Path.home() / ".local" / "share") / "modelops").resolve()


def enter_private_working_directory(prefix: str = "modelops-worker-") -> Path:
    """chdir into a fresh, empty directory only this user can read (mode 0700),
    removed at exit; returns it. Call before the first model loads."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    os.chdir(directory)
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory
