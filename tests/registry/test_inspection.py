"""inspect_artifact, end to end: every test runs the real child process on a real file."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from registry import inspection
from registry.inspection import InspectionError, default_memory_limit_bytes, inspect_artifact
from tests.fixtures.onnx_files import (
    ESCAPING_LOCATION,
    build_all_datatypes,
    build_endless_loop,
    build_external_constant,
    build_external_in_function,
    build_external_in_subgraph,
    build_external_initializer,
    build_local_function,
    build_memory_hog,
    build_output_shape_lie,
    build_sequence_input,
    write_model,
)


CHECK_NAMES = ["parse", "external_data", "operator_domains", "checker", "signature", "session", "smoke_run"]


def refusal(path, **options) -> InspectionError:
    with pytest.raises(InspectionError) as caught:
        inspect_artifact(path, **options)
    return caught.value


def check_names(report: dict) -> list[str]:
    return [check["name"] for check in report["checks"]]


# ---------------------------------------------------------------- accepted models


def test_good_model_signature_matches_contract(good_onnx):
    result = inspect_artifact(good_onnx)

    assert result.signature == {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": ["batch", 64]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": ["batch", 10]}],
        "opset": 17,
        "producer": "modelops-console",
    }
    assert (result.opset, result.producer) == (17, "modelops-console")


def test_good_model_report_records_every_check(good_onnx):
    report = inspect_artifact(good_onnx).report

    assert check_names(report) == CHECK_NAMES
    assert all(check["ok"] and check["message"] for check in report["checks"])
    assert report["ir_version"] == 8
    assert report["op_count"] == 4  # Gemm, Relu, Gemm, Softmax
    assert report["domains"] == ["ai.onnx"]
    assert report["provider"] == "CPUExecutionProvider"
    assert report["smoke_output_shapes"] == {"probabilities": [1, 10]}
    assert report["smoke_run_ms"] > 0
    assert report["artifact_size_bytes"] == good_onnx.stat().st_size
    assert json.loads(json.dumps(report)) == report


def test_second_good_model_has_same_signature_and_other_bytes(good_onnx, good_onnx_v2):
    assert good_onnx.read_bytes() != good_onnx_v2.read_bytes()
    assert inspect_artifact(good_onnx_v2).signature == inspect_artifact(good_onnx).signature


def test_fixed_first_dimension_is_an_int(fixed_batch_onnx):
    signature = inspect_artifact(fixed_batch_onnx).signature

    assert signature["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [1, 64]}]
    assert signature["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [1, 10]}]


def test_multi_input_model_lists_inputs_in_order(multi_input_onnx):
    signature = inspect_artifact(multi_input_onnx).signature

    assert signature["inputs"] == [
        {"name": "a", "datatype": "FP32", "shape": ["batch", 4]},
        {"name": "b", "datatype": "FP32", "shape": ["batch", 4]},
    ]
    assert signature["outputs"] == [{"name": "sum", "datatype": "FP32", "shape": ["batch", 4]}]
    assert signature["producer"] == "fixtures 1"


def test_every_v2_datatype_maps_and_unnamed_dimension_is_null(tmp_path):
    path = write_model(tmp_path, "datatypes.onnx", build_all_datatypes())

    result = inspect_artifact(path)

    datatypes = [spec["datatype"] for spec in result.signature["inputs"]]
    assert datatypes == ["FP64", "FP16", "BF16", "INT8", "INT16", "INT32", "INT64",
                         "UINT8", "UINT16", "UINT32", "UINT64", "BOOL", "BYTES"]
    assert {tuple(spec["shape"]) for spec in result.signature["inputs"]} == {("batch", 2, None)}
    assert [spec["datatype"] for spec in result.signature["outputs"]] == datatypes
    # BF16 outputs cannot become NumPy arrays when strings force plain run(): no shape.
    assert result.report["smoke_output_shapes"]["out_fp64"] == [1, 2, 1]
    assert result.report["smoke_output_shapes"]["out_bf16"] is None


def test_model_local_function_domain_is_allowed(tmp_path):
    path = write_model(tmp_path, "function.onnx", build_local_function())

    result = inspect_artifact(path)

    assert "local.fixtures" in result.report["domains"]


# ---------------------------------------------------------------- not ONNX at all: 400


@pytest.mark.parametrize("fixture", ["random_bytes_file", "truncated_onnx", "empty_file"])
def test_file_that_is_not_onnx_is_refused_with_400(fixture, request):
    error = refusal(request.getfixturevalue(fixture))

    assert error.status == 400
    assert "not an ONNX model" in error.reason
    assert check_names(error.report) == ["parse"]


# ---------------------------------------------------------------- external data: 422


@pytest.mark.parametrize(
    "build, tensor_name",
    [
        (build_external_initializer, "W0"),
        (build_external_constant, "bias"),
        (build_external_in_subgraph, "bias"),
        (build_external_in_function, "bias"),
    ],
    ids=["initializer", "constant-attribute", "if-subgraph", "local-function"],
)
def test_tensor_pointing_at_external_data_is_refused(build, tensor_name, tmp_path):
    path = write_model(tmp_path, "external.onnx", build())

    error = refusal(path)

    assert error.status == 422
    assert f"tensor '{tensor_name}'" in error.reason
    assert ESCAPING_LOCATION in error.reason
    assert check_names(error.report) == ["parse", "external_data"]


def test_external_data_fixture_is_refused(external_data_onnx):
    error = refusal(external_data_onnx)

    assert error.status == 422
    assert "tensor 'W0' points at external data '../../../etc/passwd'" in error.reason


def test_external_data_file_is_never_opened(tmp_path):
    # The location is a FIFO: anything that opened it for reading would block until
    # the timeout. A quick 422 proves the refusal comes before any read.
    os.mkfifo(tmp_path / "weights.bin")
    path = write_model(tmp_path, "external.onnx", build_external_initializer(location="weights.bin"))

    started = time.monotonic()
    error = refusal(path, timeout_s=20)

    assert error.status == 422
    assert "'weights.bin'" in error.reason
    assert time.monotonic() - started < 15


# ---------------------------------------------------------------- unusable models: 422


def test_unknown_operator_domain_is_refused(unknown_domain_onnx):
    error = refusal(unknown_domain_onnx)

    assert error.status == 422
    assert "'com.example.evil'" in error.reason
    assert "'Steal'" in error.reason
    assert check_names(error.report) == ["parse", "external_data", "operator_domains"]


def test_checker_failure_is_refused_with_checker_message(checker_failing_onnx):
    error = refusal(checker_failing_onnx)

    assert error.status == 422
    assert error.reason.startswith("the ONNX checker refused the model: ")
    assert "never_produced" in error.reason
    assert [check["ok"] for check in error.report["checks"]] == [True, True, True, False]


def test_non_tensor_input_is_refused(tmp_path):
    path = write_model(tmp_path, "sequence.onnx", build_sequence_input())

    error = refusal(path)

    assert (error.status, error.reason) == (422, "only tensor inputs and outputs are supported: 'x' is a sequence")


def test_model_onnx_runtime_cannot_load_is_refused(runtime_failing_onnx):
    error = refusal(runtime_failing_onnx)

    assert error.status == 422
    assert error.reason.startswith("ONNX Runtime could not load the model: ")
    assert "Erf" in error.reason
    assert "[ONNXRuntimeError]" not in error.reason
    assert check_names(error.report)[-1] == "session"


def test_model_failing_its_smoke_run_is_refused_without_internals(smoke_run_failing_onnx):
    error = refusal(smoke_run_failing_onnx)

    assert error.status == 422
    assert error.reason.startswith("ONNX Runtime failed to run the model on synthesised inputs: ")
    assert "cannot be reshaped" in error.reason
    assert "onnxruntime_src" not in error.reason and "onnxruntime::" not in error.reason
    assert "Traceback" not in error.reason and "\n" not in error.reason
    assert len(error.reason) <= 200 + inspection.MAX_REASON_CHARS


def test_output_shape_differing_from_declaration_is_refused(tmp_path):
    path = write_model(tmp_path, "lie.onnx", build_output_shape_lie())

    error = refusal(path)

    assert error.status == 422
    assert "output 'indices' has shape [2, 0]" in error.reason
    assert "['batch', 4]" in error.reason


# ---------------------------------------------------------------- the child process's limits


def test_endless_model_times_out_and_child_is_killed(tmp_path):
    path = write_model(tmp_path, "endless.onnx", build_endless_loop())

    started = time.monotonic()
    error = refusal(path, timeout_s=2)

    assert (error.status, error.reason) == (422, "inspection timed out after 2 s")
    assert time.monotonic() - started < 10


def test_model_allocating_gigabytes_hits_memory_limit(tmp_path):
    path = write_model(tmp_path, "hog.onnx", build_memory_hog())  # asks for 4 GiB
    assert path.stat().st_size < 1024

    error = refusal(path)  # the default limit for so small a file is ~1 GiB

    assert error.status == 422
    assert "out of memory" in error.reason and "memory limit" in error.reason


def test_crashing_child_is_reported_with_its_signal(good_onnx, monkeypatch):
    # No model is known to crash ORT 1.31 reliably, so the child command is swapped for
    # an interpreter that really segfaults; the parent's handling is what is tested.
    crashing = [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]
    monkeypatch.setattr(inspection, "_child_command", lambda path, memory_limit_bytes: crashing)

    error = refusal(good_onnx)

    assert (error.status, error.reason) == (422, "ONNX Runtime crashed while loading the model (signal 11)")


def test_unexpected_child_failure_is_our_500_without_traceback(good_onnx, monkeypatch):
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    monkeypatch.setattr(inspection, "_child_command", lambda path, memory_limit_bytes: failing)

    error = refusal(good_onnx)

    assert (error.status, error.reason) == (500, "inspection failed unexpectedly (exit code 3)")


def test_default_memory_limit_grows_with_the_file():
    assert default_memory_limit_bytes(0) == inspection.BASE_MEMORY_LIMIT_BYTES
    two_gigabytes = 2 * 10**9
    assert default_memory_limit_bytes(two_gigabytes) == inspection.BASE_MEMORY_LIMIT_BYTES + 6 * two_gigabytes
