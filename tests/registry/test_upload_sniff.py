"""The cheap check an upload gets before its 202 (``registry.artifacts.sniff``): it
refuses bytes that are plainly not an ONNX model, and never a file the inspection
would accept, whatever order or unknown fields its writer used."""

from __future__ import annotations

import inspect

import numpy as np
import onnx
import pytest

from registry.artifacts import sniff
from registry.building.onnx_build import random_mlp, to_bytes
from tests.fixtures import onnx_files

BUILDERS = sorted(
    (name, function) for name, function in vars(onnx_files).items()
    if name.startswith("build_") and callable(function)
    and all(parameter.default is not inspect.Parameter.empty for parameter in inspect.signature(function).parameters.values())
)


def written(tmp_path, data: bytes):
    path = tmp_path / "upload.onnx"
    path.write_bytes(data)
    return path


def field(number: int, wire_type: int, payload: bytes) -> bytes:
    """One protobuf field, written by hand."""
    tag = _varint(number << 3 | wire_type)
    if wire_type == sniff.LENGTH_DELIMITED:
        return tag + _varint(len(payload)) + payload
    return tag + payload


@pytest.mark.parametrize(("name", "build"), BUILDERS, ids=[name for name, _ in BUILDERS])
def test_no_model_of_the_fixtures_is_refused_by_the_cheap_check(tmp_path, name, build):
    assert sniff.not_onnx_reason(written(tmp_path, to_bytes(build()))) is None


def test_the_demo_models_pass_the_cheap_check(tmp_path):
    from registry.building import demo

    for candidate in demo.build_demo_versions():
        assert sniff.not_onnx_reason(written(tmp_path, candidate.artifact)) is None


def test_fields_in_any_order_and_unknown_fields_pass(tmp_path):
    model = random_mlp([8, 4], seed=0)
    graph = model.graph.SerializeToString()
    opset = model.opset_import[0].SerializeToString()
    # graph first, an unknown fixed32 and fixed64 field, the IR version last.
    data = (field(7, 2, graph) + field(8, 2, opset)
            + field(99, 5, b"\0\0\0\0") + field(98, 1, b"\0" * 8) + field(1, 0, bytes([8])))
    parsed = onnx.ModelProto.FromString(data)
    assert parsed.ir_version == 8 and parsed.HasField("graph")

    assert sniff.not_onnx_reason(written(tmp_path, data)) is None


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "the artifact is empty"),
        (b"these bytes are not an ONNX model", "not a protobuf message"),
        (b"\x08", "cut short inside a number"),
        (b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "longer than 10 bytes"),
        (b"\x3a\x10abc", "cut short: a field at byte 0 needs 13 more bytes"),
        (b"\x00\x01", "field number 0"),
        (bytes([8, 8]), "no IR version or no graph"),  # an IR version, no graph
        (bytes([0x3A, 0]), "no IR version or no graph"),  # a graph, no IR version
        (bytes([8, 0, 0x3A, 0]), "no IR version or no graph"),  # IR version 0, as if absent
        (bytes([8 << 3 | 2, 0]), "no IR version or no graph"),  # field 1 with the wrong wire type is not the IR version
    ],
    ids=["empty", "text", "cut-in-varint", "endless-varint", "cut-in-field", "field-zero", "no-graph", "no-ir-version", "ir-version-zero", "wrong-wire-type"],
)
def test_bytes_that_are_plainly_not_onnx_are_refused_naming_why(tmp_path, data, words):
    reason = sniff.not_onnx_reason(written(tmp_path, data))

    assert reason is not None and words in reason


def test_random_bytes_and_a_model_cut_in_half_are_refused(tmp_path):
    whole = to_bytes(random_mlp([64, 32, 10], seed=0))

    assert "not an ONNX model" in sniff.not_onnx_reason(written(tmp_path, np.random.default_rng(0).bytes(4096)))
    assert "cut short" in sniff.not_onnx_reason(written(tmp_path, whole[: len(whole) // 2]))


def test_past_the_walk_limit_the_file_is_left_to_the_inspection(tmp_path, monkeypatch):
    monkeypatch.setattr(sniff, "MAX_FIELDS_WALKED", 3)

    assert sniff.not_onnx_reason(written(tmp_path, bytes([0x28, 1] * 4))) is None  # four model_version fields, no graph seen
