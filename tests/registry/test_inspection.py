"""inspect_artifact, end to end: every test runs the real child process on a real file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from registry.artifacts import inspection
from registry.artifacts.inspection import (
    InspectionError,
    default_memory_limit_bytes,
    inspect_artifact,
    inspection_slot,
)
from registry.building.onnx_build import random_convnet, to_bytes
from tests.fixtures.onnx_files import (
    ESCAPING_LOCATION,
    build_all_datatypes,
    build_declared_input_shape,
    build_endless_loop,
    build_external_constant,
    build_external_in_function,
    build_external_in_subgraph,
    build_external_initializer,
    build_fails_above_one_row,
    build_input_of_element_type,
    build_intermediate_of_rank,
    build_intermediate_of_rank_in_a_branch,
    build_local_function,
    build_matmul,
    build_memory_hog,
    build_memory_per_row,
    build_output_listed_twice,
    build_output_of_rank,
    build_output_shape_lie,
    build_reduce_over_batch,
    build_sequence_input,
    build_sequence_softmax,
    build_unknown_domain_in_subgraph,
    build_unservable_input,
    bytes_with_input_name,
    write_model,
)

CHECK_NAMES = ["parse", "external_data", "operator_domains", "checker", "tensor_ranks", "signature", "session", "smoke_run",
               "batch_sizes", "batchability"]


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
        "batchable": True,
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


def test_the_benchmarks_conv_net_is_accepted_as_batchable_with_a_symbolic_batch(tmp_path):
    path = tmp_path / "convnet.onnx"
    path.write_bytes(to_bytes(random_convnet(seed=7)))

    result = inspect_artifact(path)

    assert result.signature == {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": ["batch", 3, 32, 32]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": ["batch", 10]}],
        "opset": 17,
        "producer": "modelops-console",
        "batchable": True,
    }


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

    assert [spec["datatype"] for spec in result.signature["inputs"]] == ["FP64", "FP16", "INT8", "INT16", "INT32", "INT64",
                                                                          "UINT8", "UINT16", "UINT32", "UINT64", "BOOL"]
    assert {tuple(spec["shape"]) for spec in result.signature["inputs"]} == {("batch", 2, None)}
    assert [spec["datatype"] for spec in result.signature["outputs"]] == ["FP64", "FP16", "INT8", "INT16", "INT32", "INT64",
                                                                           "UINT8", "UINT16", "UINT32", "UINT64", "BOOL", "BYTES"]
    assert result.report["smoke_output_shapes"]["out_fp64"] == [1, 2, 1]


def test_an_output_listed_twice_is_a_422_naming_it(tmp_path):
    """It passed as ready: the V2 metadata listed y twice, /predict answered one of them,
    and a client asking for y by name got whichever came last."""
    path = write_model(tmp_path, "twice.onnx", build_output_listed_twice())

    error = refusal(path)

    assert error.status == 422
    assert error.reason.startswith("output 'y' is listed twice among the model's outputs")


def test_an_output_no_worker_can_answer_is_a_422_naming_it(tmp_path):
    """A BF16 output passed as ready: its benchmark failed ("No corresponding Numpy type"),
    and every worker's ack of a state routing it failed."""
    path = write_model(tmp_path, "bf16.onnx", build_all_datatypes(with_unservable_outputs=True))

    error = refusal(path)

    assert error.status == 422
    assert error.reason.startswith("output 'out_bf16' is BF16: workers answer through NumPy, which has no bfloat16")


@pytest.mark.parametrize(("element_type", "datatype"), [(TensorProto.STRING, "BYTES"), (TensorProto.BFLOAT16, "BF16")])
def test_an_input_no_request_can_carry_is_a_422_naming_it(element_type, datatype, tmp_path):
    # A worker decodes numeric and boolean inputs only: such a model, once routed, could
    # not even be warmed, and the state that routes it would be refused by every worker.
    path = write_model(tmp_path, "unservable.onnx", build_unservable_input(element_type))

    error = refusal(path)

    assert error.status == 422
    assert error.reason.startswith(f"input 'x' is {datatype}: workers decode only numeric and boolean inputs")
    assert check_names(error.report)[-1] == "signature"


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


def test_an_unknown_operator_domain_inside_an_if_branch_is_refused_at_the_domain_check(tmp_path):
    # ONNX Runtime refuses such a model too, later; this check names the domain and the op.
    path = write_model(tmp_path, "hidden_domain.onnx", build_unknown_domain_in_subgraph())

    error = refusal(path)

    assert error.status == 422
    assert error.reason.endswith("operator domain 'com.example.evil' (op 'Steal') is not provided by ONNX Runtime")
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
    # The CPU limit (which defaults to the timeout) out of the way: ONNX Runtime's threads
    # can spend 2 s of CPU before 2 s of wall time pass, and that refusal, tested below,
    # then came first (once in a CI-environment run).
    error = refusal(path, timeout_s=2, cpu_limit_s=60)

    assert (error.status, error.reason) == (422, "inspection timed out after 2 s")
    assert time.monotonic() - started < 10


def test_the_inspection_child_dies_with_the_process_that_started_it(tmp_path):
    """A Celery worker killed with -9 left its inspection child running at 85 % of a core,
    reparented to PID 1, beside the retried inspection (a fault test, 7 Dec)."""
    path = write_model(tmp_path, "endless.onnx", build_endless_loop())
    code = f"from registry.artifacts.inspection import inspect_artifact; inspect_artifact({str(path)!r}, timeout_s=120, cpu_limit_s=120)"
    parent = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings"})
    child = None
    try:
        child = _first_child(parent.pid, deadline_s=30)
        parent.kill()
        parent.wait(timeout=10)
        assert _gone(child, deadline_s=10), f"inspection child {child} outlived its parent"
    finally:
        parent.kill()
        if child is not None and not _gone(child, deadline_s=0.1):
            os.kill(child, 9)  # by its PID: the orphan this test made


def _first_child(pid: int, deadline_s: float) -> int:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children = (task / "children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.05)
    raise AssertionError(f"process {pid} started no child in {deadline_s} s")


def _gone(pid: int, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":  # dead, waiting for init to reap it
            return True
        time.sleep(0.05)
    return False


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
    monkeypatch.setattr(inspection, "_child_command", lambda path, limits: crashing)

    error = refusal(good_onnx)

    assert (error.status, error.reason) == (422, "ONNX Runtime crashed while loading the model (signal 11)")


def test_unexpected_child_failure_is_our_500_without_traceback(good_onnx, monkeypatch):
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    monkeypatch.setattr(inspection, "_child_command", lambda path, limits: failing)

    error = refusal(good_onnx)

    assert (error.status, error.reason) == (500, "inspection failed unexpectedly (exit code 3)")


def test_default_memory_limit_grows_with_the_file():
    assert default_memory_limit_bytes(0) == inspection.BASE_MEMORY_LIMIT_BYTES
    two_gigabytes = 2 * 10**9
    assert default_memory_limit_bytes(two_gigabytes) == inspection.BASE_MEMORY_LIMIT_BYTES + 6 * two_gigabytes


# ---------------------------------------------------------------- the child's surroundings

SECRETS = {"DATABASE_URL": "postgres://u:leaked@db/x", "DJANGO_SECRET_KEY": "leaked-key", "SERVING_WORKER_TOKEN": "leaked-token",
           "REDIS_URL": "redis://:leaked@redis:6379/0", "SOME_OTHER_SETTING": "leaked-too"}
# Run instead of the real child: answers a refusal whose reason is what it observed.
OBSERVE_SURROUNDINGS = """
import json, os, stat
seen = {"cwd": os.getcwd(), "mode": stat.S_IMODE(os.stat(".").st_mode), "entries": os.listdir("."),
        "environment": dict(os.environ)}
print(json.dumps({"ok": False, "status": 422, "reason": json.dumps(seen), "report": {}}))
"""


def test_child_runs_in_an_empty_private_directory_without_secrets(good_onnx, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(inspection, "_child_command", lambda path, limits: [sys.executable, "-c", OBSERVE_SURROUNDINGS])

    seen = json.loads(refusal(good_onnx).reason)

    assert seen["entries"] == []
    assert seen["mode"] == 0o700
    assert Path(seen["cwd"]) != inspection._PROJECT_ROOT
    assert not Path(seen["cwd"]).exists()  # removed once the child is done
    assert not set(SECRETS) & set(seen["environment"])
    assert set(seen["environment"]) <= set(inspection.CHILD_INHERITED_VARIABLES) | {
        "MALLOC_ARENA_MAX", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
        "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "HOME", "TMPDIR"}
    assert seen["environment"]["HOME"] == seen["environment"]["TMPDIR"] == seen["cwd"]


def test_real_child_inspects_from_its_private_directory(good_onnx, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)

    result = inspect_artifact(good_onnx)

    assert result.signature["batchable"] is True


def test_child_reports_the_limits_it_runs_under(good_onnx):
    limits = inspect_artifact(good_onnx, timeout_s=30, memory_limit_bytes=2 * 2**30).report["limits"]

    assert limits == {
        "address_space_bytes": 2 * 2**30,
        "cpu_time_s": 30,
        "open_files": inspection.CHILD_MAX_OPEN_FILES,
        "file_size_bytes": inspection.CHILD_MAX_FILE_BYTES,
        "processes": 0,
        "core_file_bytes": 0,
    }


def test_cpu_time_limit_stops_a_busy_child_before_the_timeout(tmp_path):
    path = write_model(tmp_path, "endless.onnx", build_endless_loop())

    started = time.monotonic()
    error = refusal(path, timeout_s=30, cpu_limit_s=1)

    assert (error.status, error.reason) == (422, "inspection used more than its CPU time limit of 1 s")
    assert time.monotonic() - started < 15


PROBE_LIMITS = """
import json, os
from registry.artifacts.inspection import ChildLimits, _limit_resources
_limit_resources(ChildLimits(memory_limit_bytes=2**31, cpu_limit_s=10))
seen = {}
try:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    seen["fork"] = "allowed"
except OSError:
    seen["fork"] = "refused"
try:
    with open("big.bin", "wb") as handle:
        handle.write(bytes(9 * 2**20))
    seen["big_file"] = "written"
except OSError:
    seen["big_file"] = "refused"
handles = []
try:
    for _ in range(100):
        handles.append(open(os.devnull))
    seen["many_files"] = "opened"
except OSError:
    seen["many_files"] = "refused"
print(json.dumps(seen))
"""


def test_child_limits_refuse_forks_big_files_and_many_descriptors(tmp_path):
    command = [sys.executable, "-c", PROBE_LIMITS]
    if os.geteuid() == 0:
        # Root is exempt from RLIMIT_NPROC: probe as 'nobody', keeping only file access.
        assert shutil.which("setpriv"), "as root the probe needs setpriv (Debian's util-linux) to drop to 'nobody'"
        capabilities = "+dac_read_search,+dac_override"
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                   f"--inh-caps={capabilities}", f"--ambient-caps={capabilities}", *command]

    completed = subprocess.run(command, cwd=tmp_path, capture_output=True, timeout=60, check=True,
                               env={"PATH": os.environ["PATH"], "PYTHONPATH": str(inspection._PROJECT_ROOT)})

    assert json.loads(completed.stdout) == {"fork": "refused", "big_file": "refused", "many_files": "refused"}


# ---------------------------------------------------------------- how many at once


def test_inspection_slots_are_shared_and_a_full_set_is_a_503(tmp_path):
    with inspection_slot(tmp_path, 2) as first, inspection_slot(tmp_path, 2) as second:
        with pytest.raises(InspectionError) as caught, inspection_slot(tmp_path, 2):
            pass
    with inspection_slot(tmp_path, 2) as again:
        pass

    assert (first, second, again) == (0, 1, 0)
    assert caught.value.status == 503
    assert caught.value.retry_after_s == inspection.RETRY_AFTER_S
    assert "too many inspections" in caught.value.reason


def test_slot_held_by_another_process_is_not_taken(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'ab'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(tmp_path / "slot-0")],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"held\n"
        with pytest.raises(InspectionError) as caught, inspection_slot(tmp_path, 1):
            pass
    finally:
        holder.kill()
        holder.wait(timeout=10)
    with inspection_slot(tmp_path, 1) as index:
        pass

    assert caught.value.status == 503
    assert index == 0


# ---------------------------------------------------------------- declared dimensions


@pytest.mark.parametrize(
    "shape, words",
    [
        (["batch", -3], "a dimension of -3: dimensions must be positive"),
        (["batch", 0], "a dimension of 0: dimensions must be positive"),
        (["batch", 2**21], f"a dimension of {2**21}, more than the limit {2**20}"),
        (["batch", 2**12, 2**13], f"{2**25} elements per request, more than the limit {16 * 2**20}"),
    ],
    ids=["negative", "zero", "huge", "huge-product"],
)
def test_unservable_declared_dimension_is_a_422_naming_the_input(shape, words, tmp_path):
    path = write_model(tmp_path, "dims.onnx", build_declared_input_shape(shape))

    error = refusal(path)

    assert (error.status, error.reason) == (422, f"input 'x' declares {words}")
    assert check_names(error.report)[-1] == "signature"


# ---------------------------------------------------------------- the batch sizes a worker warms


def test_inspection_runs_every_batch_size_the_worker_warms(good_onnx):
    report = inspect_artifact(good_onnx, max_batch_size=8).report

    assert report["batch_sizes_run"] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_model_failing_at_two_rows_is_refused_at_upload(tmp_path):
    path = write_model(tmp_path, "one_row.onnx", build_fails_above_one_row())

    error = refusal(path)

    assert error.status == 422
    assert error.reason.startswith("ONNX Runtime failed to run the model at batch size 2: ")
    assert check_names(error.report)[-1] == "batch_sizes"


def test_model_exceeding_memory_only_at_the_max_batch_size_is_refused(tmp_path):
    path = write_model(tmp_path, "per_row.onnx", build_memory_per_row())

    error = refusal(path, max_batch_size=32)

    assert error.status == 422
    assert "out of memory" in error.reason
    assert check_names(error.report)[-1] == "batch_sizes"


# ---------------------------------------------------------------- batchability, proven


@pytest.mark.parametrize(
    "build, reason",
    [
        (build_reduce_over_batch, "output 'total' does not follow the batch: 1 row(s) for one input row, 1 for two"),
        (build_sequence_softmax, "output 'y' changes for one row when another row is batched with it"),
    ],
    ids=["reduce-over-batch", "sequence-softmax"],
)
def test_model_mixing_rows_is_not_batchable(build, reason, tmp_path):
    path = write_model(tmp_path, "mixing.onnx", build())

    result = inspect_artifact(path)

    assert result.signature["batchable"] is False
    assert result.report["batchable"] is False
    assert result.report["not_batchable_reason"] == reason


@pytest.mark.parametrize("build", [build_matmul, build_local_function], ids=["matmul", "local-function"])
def test_row_wise_model_is_batchable(build, tmp_path):
    path = write_model(tmp_path, "rowwise.onnx", build())

    result = inspect_artifact(path)

    assert result.signature["batchable"] is True
    assert "not_batchable_reason" not in result.report


def test_fixed_first_dimension_is_not_batchable(fixed_batch_onnx):
    result = inspect_artifact(fixed_batch_onnx)

    assert result.signature["batchable"] is False
    assert result.report["not_batchable_reason"] == "input 'input' has no dynamic first dimension"
    assert "batch_sizes_run" not in result.report



# ---------------------------------------------------------------- names every state carries


def renamed_output(name: str):
    model = build_matmul()
    model.graph.node[0].output[0] = name
    model.graph.output[0].name = name
    return model


def test_an_output_name_past_the_limit_is_refused_before_it_reaches_the_report(tmp_path):
    # A 20 MiB output name made every desired state 20 MB, past what a worker persists.
    error = refusal(write_model(tmp_path, "long-name.onnx", renamed_output("y" * 257)))

    assert error.status == 422
    assert "an output name of 257 characters" in error.reason and "more than the limit 256" in error.reason
    assert check_names(error.report) == ["parse"]
    assert "y" * 257 not in json.dumps(error.report)


def test_an_output_name_at_the_limit_is_accepted(tmp_path):
    result = inspect_artifact(write_model(tmp_path, "name.onnx", renamed_output("y" * 256)))

    assert [spec["name"] for spec in result.signature["outputs"]] == ["y" * 256]


def test_more_operator_sets_than_the_limit_are_refused_and_not_listed_in_the_report(tmp_path):
    # 200,000 declared operator sets stored a 43 MB report, kept with the rejected version.
    model = build_matmul()
    for index in range(inspection.MAX_OPSET_IMPORTS):
        model.opset_import.add(domain=f"com.example.d{index}", version=1)

    error = refusal(write_model(tmp_path, "opsets.onnx", model))

    assert "operator sets, more than the limit 64" in error.reason
    assert "opset_imports" not in error.report


def test_more_outputs_than_the_limit_are_refused(tmp_path):
    # Every output name travels in each desired state sent to every worker: one past the limit is refused.
    model = build_matmul()
    for index in range(inspection.MAX_GRAPH_TENSORS + 1 - len(model.graph.output)):
        model.graph.output.append(onnx.helper.make_tensor_value_info(f"extra{index}", TensorProto.FLOAT, [1]))
    assert len(model.graph.output) == inspection.MAX_GRAPH_TENSORS + 1

    error = refusal(write_model(tmp_path, "outputs.onnx", model))

    assert f"the model has {inspection.MAX_GRAPH_TENSORS + 1} outputs, more than the limit {inspection.MAX_GRAPH_TENSORS}" in error.reason


def test_a_producer_name_longer_than_its_column_is_cut_to_it(tmp_path):
    model = build_matmul()
    model.producer_name = "p" * 5000

    result = inspect_artifact(write_model(tmp_path, "producer.onnx", model))

    assert result.producer == "p" * 200


def test_a_model_that_never_finishes_at_one_batch_size_inside_the_max_is_refused(tmp_path):
    # It passed 1, 2 and 32, then held every worker's warm-up: 17 rows loop 10**12 times.
    from tests.serving.serving_testkit import loops_for_ever_at

    error = refusal(write_model(tmp_path, "wedge.onnx", loops_for_ever_at(17)), timeout_s=3)

    assert (error.status, error.reason) == (422, "inspection timed out after 3 s")


@pytest.mark.parametrize(("name", "code"), [("y\x1b[31m", "001B"), ("y\u202eexe.txt", "202E"), ("y\u200fz", "200F"),
                                            ("y\u200bz", "200B"), ("y\u2028z", "2028"), ("y\u061cz", "061C")])
def test_an_output_name_with_a_control_character_is_refused_naming_it(tmp_path, name, code):
    error = refusal(write_model(tmp_path, "control.onnx", renamed_output(name)))

    assert error.status == 422
    assert error.reason == f"an output name holds the control character U+{code}, which no name needs"


def test_initializers_listed_as_inputs_count_as_weights_not_inputs(tmp_path):
    # IR 3 exporters (and PyTorch's keep_initializers_as_inputs) list every weight as an input.
    model = build_matmul()
    for index in range(inspection.MAX_GRAPH_TENSORS + 10):
        name = f"w{index}"
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(1, np.float32), name))
        model.graph.input.append(onnx.helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]))

    result = inspect_artifact(write_model(tmp_path, "weights-as-inputs.onnx", model))

    assert [spec["name"] for spec in result.signature["inputs"]] == ["x"]


def test_past_64_rows_only_the_max_batch_size_is_run(good_onnx):
    report = inspect_artifact(good_onnx, max_batch_size=100).report

    assert report["batch_sizes_run"] == [*range(1, 65), 100]


def test_a_symbolic_dimension_name_past_the_limit_is_refused(tmp_path):
    # A 17.5 MB dim_param made every desired state 21.5 MB.
    model = build_matmul()
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "\u202e" + "d" * 300

    error = refusal(write_model(tmp_path, "long-dim.onnx", model))

    assert error.status == 422
    assert error.reason.startswith("a dimension name of output 'y' of 301 characters")


def test_a_producer_s_control_characters_are_dropped(tmp_path):
    model = build_matmul()
    model.producer_name = "evil\x1b[31m\u202e"

    assert inspect_artifact(write_model(tmp_path, "producer.onnx", model)).producer.split()[0] == "evil[31m"


def test_a_max_batch_size_of_one_runs_one_row_once(good_onnx):
    assert inspect_artifact(good_onnx, max_batch_size=1).report["batch_sizes_run"] == [1]


def _relu_with_the_onnx_packages_defaults(ir_version: int | None = None) -> onnx.ModelProto:
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "relu",
                                   [onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                                   [onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = onnx.helper.make_model(graph)  # the onnx package's newest IR version and opset (14 and 28 with onnx 1.23)
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def test_a_model_saved_newer_than_onnx_runtime_loads_is_told_how_to_save_it(tmp_path):
    """A newcomer's first model, built with the bundled onnx package's defaults, was refused
    for its IR version, then for its opset, each time with nothing said of what to do."""
    newest = tmp_path / "newest.onnx"
    onnx.save(_relu_with_the_onnx_packages_defaults(), newest)
    older_ir = tmp_path / "older-ir.onnx"
    onnx.save(_relu_with_the_onnx_packages_defaults(ir_version=13), older_ir)

    for path, words in ((newest, "save the model with an IR version at most the one named (with the onnx package: model.ir_version = N"),
                        (older_ir, "save the model with an ai.onnx opset at most the one named")):
        error = refusal(path)
        assert error.status == 422
        assert error.reason.startswith("ONNX Runtime could not load the model: ") and words in error.reason, error.reason


# ---------------------------------------------------------------- more dimensions than NumPy holds


def test_an_output_of_more_dimensions_than_numpy_holds_is_refused_naming_it(tmp_path):
    # It passed as ready (its runs read OrtValues), and every worker's warm-up raised in session.run.
    error = refusal(write_model(tmp_path, "deep-output.onnx", build_output_of_rank(65)))

    assert error.status == 422
    assert error.reason.startswith("tensor 'y' has 65 dimensions, more than the limit of 64")
    assert check_names(error.report)[-1] == "tensor_ranks"


def test_an_intermediate_tensor_of_more_than_64_dimensions_is_refused_naming_it(tmp_path):
    error = refusal(write_model(tmp_path, "deep-inside.onnx", build_intermediate_of_rank(65)))

    assert error.reason.startswith("tensor 'deep' has 65 dimensions, more than the limit of 64")


def test_a_tensor_of_more_than_64_dimensions_inside_a_branch_is_refused_naming_it(tmp_path):
    # The check's copy of the model leaves out large weights, a branch's too (a copy with
    # them took 0.8 GB more than the checker for a 200 MB model): not the branch's tensors.
    error = refusal(write_model(tmp_path, "deep-in-branch.onnx", build_intermediate_of_rank_in_a_branch(65)))

    assert error.reason.startswith("tensor 'deep_in_branch' has 65 dimensions, more than the limit of 64")


def test_an_output_of_64_dimensions_is_accepted(tmp_path):
    result = inspect_artifact(write_model(tmp_path, "rank-64.onnx", build_output_of_rank(64)))

    assert result.signature["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [1] * 64}]


# ---------------------------------------------------------------- what the onnx package and protobuf hand over unchecked


def test_an_input_of_an_unknown_element_type_is_refused_naming_it_not_a_crash(tmp_path):
    # The checker raises ValueError for it, which crashed the child: "inspection failed unexpectedly", a 500.
    error = refusal(write_model(tmp_path, "type-999.onnx", build_input_of_element_type(999)))

    assert (error.status, error.reason) == (422, "the ONNX checker failed on this model: Invalid tensor data type 999.")
    assert check_names(error.report)[-1] == "checker"


def test_an_input_name_that_is_not_utf8_is_refused_naming_the_field_not_a_crash(tmp_path):
    # Protobuf hands a proto2 string that is not UTF-8 over as bytes; the name checks raised TypeError on it.
    path = tmp_path / "surrogate-name.onnx"
    path.write_bytes(bytes_with_input_name(b"\xed\xa0\x80"))

    error = refusal(path)

    assert error.status == 422
    assert error.reason == "the field 'name' of a ValueInfoProto holds bytes that are not UTF-8 text; ONNX requires UTF-8"
    assert check_names(error.report) == ["parse"]
