"""Inspect an uploaded ONNX artifact before the registry accepts it.

Why a child process: parsing a hostile protobuf and building an ONNX Runtime session
run native code that can segfault, spin forever or allocate without bound. Doing that
inside the (threaded) Django server would let one bad upload take the server down. So
``inspect_artifact`` starts a fresh interpreter (``python -m registry.artifacts.inspection``,
the file opened as its stdin; a fresh exec, never a fork of the server's threads), gives
it an address-space limit and a wall-clock timeout, and reads one JSON object from its
stdout. A signal, a timeout or an exhausted memory limit becomes an ``InspectionError``
with a readable reason. Given the sha256 the upload was hashed to, the child reads the
file once and inspects those bytes only if they still have it (``read_checked``): a
stored upload rewritten before its validation job ran made the version ready with
another model's signature.

The child is treated as hostile-code-adjacent: it starts in a fresh empty directory
(mode 0700, removed afterwards) with a minimal environment (no database URL, no
secret key, no worker token), and sets its own limits on address space, CPU time,
open files, file size, processes and core files. ``inspection_slot`` caps how many
children run at once across every server process (``flock`` on slot files).

The child runs the checks in this order, stopping at the first refusal:
parse (400; text that is not UTF-8 is 422) -> no external data anywhere
(``serving.model_safety``, the same walk the workers repeat) -> known operator domains
-> onnx checker -> no tensor of more than 64 dimensions, declared or inferred ->
tensor-only signature with sane dimensions -> ONNX Runtime session -> one smoke run
-> runs at the batch sizes a worker warms (all 422) -> the batchability proof, which
never refuses but decides ``signature["batchable"]``. A step that raises what it does
not expect refuses the model (422) naming the step and the error: every such crash
found was a file the onnx package or our own checks could not read.

This module imports no Django; the server process never imports onnxruntime.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import json
import logging
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto

from serving.contract import DEFAULT_MAX_BATCH_SIZE, SERVABLE_INPUT_DATATYPES, UNSERVABLE_OUTPUT_DATATYPES
from serving.model_safety import ORT_FORMAT_ID, UnsafeModel, read_checked, refuse_external_references, walk_messages

logger = logging.getLogger(__name__)

_PROJECT_ROOT = Path(__file__).resolve().parents[2]

# Measured on this project's CPU box (ORT 1.31, one thread, MALLOC_ARENA_MAX=2): a
# small model peaks at ~170 MiB of address space; a 1.94 GB model peaks at 9.8 GB,
# about 5x its size (file bytes, parsed proto, the checker's copies, ORT's copy and
# prepacked weights). 1 GiB plus 6x the file lets a 2 GB model load with ~25% to spare,
# while a 10 kB model that asks for 4 GiB at run time is stopped at ~1 GiB.
BASE_MEMORY_LIMIT_BYTES = 1024 * 1024 * 1024
MEMORY_LIMIT_BYTES_PER_MODEL_BYTE = 6

ONNX_RUNTIME_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})
MAX_REASON_CHARS = 400
STOP_POLL_S = 0.25

# The child writes nothing but its answer (to a pipe, which RLIMIT_FSIZE does not
# count) and needs a handful of descriptors once its imports are done.
CHILD_MAX_FILE_BYTES = 8 * 1024 * 1024
CHILD_MAX_OPEN_FILES = 64
# The child needs no new process or thread (one ORT thread, one BLAS thread). Linux
# counts RLIMIT_NPROC per user over all its processes, so 0 means "fork nothing";
# root (CAP_SYS_RESOURCE) is exempt, which is one more reason not to run as root.
CHILD_MAX_PROCESSES = 0
# Environment variables the child may inherit; everything else (DATABASE_URL,
# DJANGO_SECRET_KEY, SERVING_WORKER_TOKEN, REDIS_URL, ...) stays with the parent.
CHILD_INHERITED_VARIABLES = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH", "TZ")

# Declared input dimensions a worker can serve: positive, and no request bigger than
# a worker's default element limit (SERVING_MAX_ELEMENTS).
MAX_DIMENSION = 2**20
# Names and lists every desired state carries (the signature) or the report stores.
MAX_NAME_CHARS = 256
EVERY_BATCH_SIZE_UP_TO = 64  # then only the max batch size (below)
# C0 and C1 controls, bidirectional marks, overrides and isolates, zero-width and line/paragraph separators, BOM.
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
PRODUCER_CHARS = 200  # the column's length (registry.models.ModelVersion.producer)
MAX_GRAPH_TENSORS = 1024
MAX_OPSET_IMPORTS = 64
MAX_INPUT_ELEMENTS = 16 * 1024 * 1024
# NumPy's NPY_MAXDIMS. ONNX Runtime's Python API hands every answer over as a NumPy array,
# and so does a worker: a model whose output had 65 dimensions passed inspection (its runs
# read OrtValues) and then failed every worker's warm-up. Intermediate tensors are held to
# it too: no real model needs more, and one rule is easier to state and to check.
MAX_TENSOR_RANK = 64
# Shape inference for the rank check runs on a copy without the weights (a second copy of a
# 2 GB model would pass the memory limit); tensors of up to this many elements keep their
# values, which is every shape, axis or pad tensor an operator's inference reads. Counted
# from the dims: ByteSize() walks the data (0.8 s for a 135 MB model).
INFERENCE_VALUE_ELEMENTS = 4096
# Batchability: a row alone and the same row batched with another must agree to
# within what a different GEMM blocking can change, no more.
FLOAT_TOLERANCE = {np.float16: (1e-2, 1e-3)}
DEFAULT_TOLERANCE = (1e-4, 1e-5)  # (rtol, atol)
RETRY_AFTER_S = 5

V2_DATATYPES = {
    TensorProto.FLOAT: "FP32",
    TensorProto.DOUBLE: "FP64",
    TensorProto.FLOAT16: "FP16",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.INT8: "INT8",
    TensorProto.INT16: "INT16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.UINT8: "UINT8",
    TensorProto.UINT16: "UINT16",
    TensorProto.UINT32: "UINT32",
    TensorProto.UINT64: "UINT64",
    TensorProto.BOOL: "BOOL",
    TensorProto.STRING: "BYTES",
}

# BF16 has no NumPy dtype: its zeros are built as uint16 and tagged for ORT.
_NUMPY_DTYPES = {
    "FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "BF16": np.uint16,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "BOOL": np.bool_, "BYTES": object,
}

_NON_TENSOR_KINDS = {
    "sequence_type": "a sequence",
    "map_type": "a map",
    "optional_type": "an optional",
    "sparse_tensor_type": "a sparse tensor",
    None: "of no declared type",
}


class InspectionError(Exception):
    """The artifact was refused; ``reason`` is a sentence for the uploader.

    ``status`` is 400 when the file is not an ONNX model at all, 422 when it is one
    but cannot be served, 500 when the inspection itself failed (our bug, logged),
    503 when no inspection slot is free (``retry_after_s`` says when to try again).
    ``report`` holds the checks run so far.
    """

    def __init__(self, reason: str, *, status: int = 422, report: dict | None = None, retry_after_s: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.report = report or {}
        self.retry_after_s = retry_after_s


class InspectionStopped(Exception):
    """The caller asked the inspection to stop (a cancelled validation job); the child
    was killed and no verdict was reached."""


@dataclass
class InspectionReport:
    signature: dict
    opset: int
    producer: str
    report: dict


@dataclass(frozen=True)
class ChildLimits:
    """What one child may use; ``max_batch_size`` is the largest batch it must run."""

    memory_limit_bytes: int
    cpu_limit_s: int
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE

    def arguments(self) -> list[str]:
        return ["--memory-limit-bytes", str(self.memory_limit_bytes), "--cpu-limit-s", str(self.cpu_limit_s),
                "--max-batch-size", str(self.max_batch_size)]


# ---------------------------------------------------------------- parent side


def inspect_artifact(
    artifact: str | os.PathLike | BinaryIO,
    *,
    sha256: str | None = None,
    timeout_s: float = 60,
    memory_limit_bytes: int | None = None,
    cpu_limit_s: float | None = None,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    should_stop: Callable[[], bool] | None = None,
) -> InspectionReport:
    """Inspect the ONNX file ``artifact`` (a path, or the file opened) in a child process;
    raise InspectionError. With ``sha256``, bytes that no longer have it are not inspected
    (an InspectionError of status 500: no verdict on the upload). ``should_stop`` is asked
    every ``STOP_POLL_S`` while the child runs: when it says so, the child is killed and
    InspectionStopped raised.

    ``memory_limit_bytes=None`` sizes the limit from the file (see
    ``default_memory_limit_bytes``); ``cpu_limit_s=None`` allows the wall-clock
    timeout's worth of CPU time. ``max_batch_size`` is the largest batch a worker
    will warm this model at: the child runs it too.
    """
    if should_stop is not None and should_stop():
        raise InspectionStopped()
    with contextlib.ExitStack() as closing:
        opened = closing.enter_context(open(artifact, "rb")) if isinstance(artifact, str | os.PathLike) else artifact
        if memory_limit_bytes is None:
            memory_limit_bytes = default_memory_limit_bytes(os.fstat(opened.fileno()).st_size)
        limits = ChildLimits(memory_limit_bytes, math.ceil(cpu_limit_s or timeout_s), max(1, max_batch_size))
        completed = _run_child(opened, sha256, timeout_s, limits, should_stop)
    return _result_from_child(completed, limits)


def default_memory_limit_bytes(artifact_size_bytes: int) -> int:
    """The child's address-space limit for a model file of this size."""
    return BASE_MEMORY_LIMIT_BYTES + MEMORY_LIMIT_BYTES_PER_MODEL_BYTE * artifact_size_bytes


@contextlib.contextmanager
def inspection_slot(directory: str | os.PathLike, count: int) -> Iterator[int]:
    """Hold one of ``count`` slots, shared by every process using ``directory``.

    Each slot is an exclusive ``flock`` on a file: the kernel drops it when the holder
    exits, however it exits, so a crashed server never leaks a slot. Raises
    InspectionError(status=503) at once when all are taken.
    """
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for index in range(count):
        handle = open(directory / f"slot-{index}", "ab")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        with handle:
            yield index
        return
    raise InspectionError(f"too many inspections are running (limit {count}); try again shortly",
                          status=503, retry_after_s=RETRY_AFTER_S)


def _child_command(sha256: str | None, limits: ChildLimits) -> list[str]:
    # Killed with the process that started it, as a job's child is (registry/jobs/child.py):
    # a Celery worker killed with -9 left it computing, reparented to PID 1, beside the retry.
    dies_with_parent = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
    checked = ["--sha256", sha256] if sha256 else []
    # -P: the empty working directory is not put on sys.path; PYTHONPATH names the code.
    return [*dies_with_parent, sys.executable, "-P", "-m", "registry.artifacts.inspection", *checked, *limits.arguments()]


def _child_environment(private_directory: str) -> dict[str, str]:
    """Only what the child needs: no secret, no database or Redis URL, no token."""
    environment = {name: os.environ[name] for name in CHILD_INHERITED_VARIABLES if name in os.environ}
    environment.setdefault("PATH", os.defpath)
    # Every thread's glibc arena and BLAS buffer counts against RLIMIT_AS, and the
    # inspection needs no parallelism: pin both so the limit measures the model.
    environment.update(
        MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
        PYTHONPATH=str(_PROJECT_ROOT), PYTHONDONTWRITEBYTECODE="1",
        HOME=private_directory, TMPDIR=private_directory,
    )
    return environment


def _run_child(artifact: BinaryIO, sha256: str | None, timeout_s: float, limits: ChildLimits,
               should_stop: Callable[[], bool] | None = None) -> subprocess.CompletedProcess:
    # A fresh empty directory (mkdtemp: mode 0700) as cwd: a relative path the checks
    # missed would resolve to nothing, never to the project's var/ or database.
    with tempfile.TemporaryDirectory(prefix="modelops-inspect-", ignore_cleanup_errors=True) as private_directory:
        # The child sets its own rlimits first thing: preexec_fn is unsafe in a
        # threaded parent (it can deadlock between fork and exec).
        with subprocess.Popen(_child_command(sha256, limits), cwd=private_directory, env=_child_environment(private_directory),
                              stdin=artifact, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
            stdout, stderr = _wait_for(child, timeout_s, should_stop)
        return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


def _wait_for(child: subprocess.Popen, timeout_s: float, should_stop: Callable[[], bool] | None) -> tuple[bytes, bytes]:
    """The child's output once it exits; killed past ``timeout_s`` or when asked to stop."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            # communicate() may be called again after a timeout without losing output.
            return child.communicate(timeout=max(0.0, min(STOP_POLL_S, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            _kill(child)
            raise InspectionError(f"inspection timed out after {timeout_s:g} s") from None
        if should_stop is not None and should_stop():
            _kill(child)
            raise InspectionStopped()


def _kill(child: subprocess.Popen) -> None:
    child.kill()
    child.communicate()


def _result_from_child(completed: subprocess.CompletedProcess, limits: ChildLimits) -> InspectionReport:
    result = _parse_child_output(completed.stdout)
    if result is None:
        raise _error_for_failed_child(completed, limits)
    if not result["ok"]:
        unexpected = result["report"].get("unexpected_error")
        if unexpected:  # refused, as it should be; but a step of ours may have met a case it should name
            logger.warning("inspection step %s raised %s: %s", unexpected["step"], unexpected["type"], result["reason"])
        raise InspectionError(result["reason"], status=result["status"], report=result["report"])
    return InspectionReport(
        signature=result["signature"], opset=result["opset"], producer=result["producer"], report=result["report"]
    )


def _parse_child_output(stdout: bytes) -> dict | None:
    try:
        return json.loads(stdout)
    except ValueError:  # empty or cut short: the child died before answering
        return None


def _error_for_failed_child(completed: subprocess.CompletedProcess, limits: ChildLimits) -> InspectionError:
    stderr = completed.stderr.decode("utf-8", "replace")
    if _mentions_memory_exhaustion(stderr):
        return InspectionError(_memory_reason(limits.memory_limit_bytes))
    if completed.returncode == -signal.SIGXCPU:  # the soft RLIMIT_CPU; its default action kills
        return InspectionError(f"inspection used more than its CPU time limit of {limits.cpu_limit_s} s")
    if completed.returncode < 0:
        return InspectionError(f"ONNX Runtime crashed while loading the model (signal {-completed.returncode})")
    logger.error("inspection child failed with exit code %s: %s", completed.returncode, stderr[-4000:])
    return InspectionError(f"inspection failed unexpectedly (exit code {completed.returncode})", status=500)


def _mentions_memory_exhaustion(text: str) -> bool:
    markers = ("MemoryError", "bad_alloc", "bad allocation", "Failed to allocate memory")
    return any(marker in text for marker in markers)


def _memory_reason(memory_limit_bytes: int | None) -> str:
    limit = f" of {memory_limit_bytes / 2**30:.1f} GiB" if memory_limit_bytes else ""
    return f"inspection ran out of memory: the model needs more than the memory limit{limit}"


# ---------------------------------------------------------------- child side


class _Refusal(Exception):
    def __init__(self, reason: str, status: int = 422):
        super().__init__(reason)
        self.reason = reason
        self.status = status


def main(argv: list[str] | None = None) -> int:
    arguments = _parse_arguments(argv)
    limits = ChildLimits(arguments.memory_limit_bytes, arguments.cpu_limit_s, arguments.max_batch_size)
    _limit_resources(limits)
    result_stream = _claim_stdout()
    result = _ChildInspection(sys.stdin.buffer, arguments.sha256, limits).run()
    result_stream.write(json.dumps(result))
    result_stream.flush()
    return 0


def _peak_memory() -> dict:
    """Peak resident and virtual memory of this child, to tune the memory limit by."""
    peak = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:  # not Linux
        return peak
    match = re.search(r"^VmPeak:\s+(\d+) kB", status, re.MULTILINE)
    if match:
        peak["peak_virtual_memory_bytes"] = int(match.group(1)) * 1024
    return peak


def _parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m registry.artifacts.inspection", description="Inspect the ONNX file on stdin.")
    parser.add_argument("--sha256", help="inspect nothing unless the file's bytes have this sha256")
    parser.add_argument("--memory-limit-bytes", type=int, default=0)
    parser.add_argument("--cpu-limit-s", type=int, default=0)
    parser.add_argument("--max-batch-size", type=int, default=DEFAULT_MAX_BATCH_SIZE)
    return parser.parse_args(argv)


def _limit_resources(limits: ChildLimits) -> None:
    # No core files: a crashing model must not leave gigabytes on the server's disk.
    _lower_limit(resource.RLIMIT_CORE, 0)
    if limits.memory_limit_bytes:
        _lower_limit(resource.RLIMIT_AS, limits.memory_limit_bytes)
    if limits.cpu_limit_s:
        # SIGXCPU (which kills) at the soft limit; SIGKILL at the hard one backs it up.
        _lower_limit(resource.RLIMIT_CPU, limits.cpu_limit_s, hard=limits.cpu_limit_s + 1)
    _lower_limit(resource.RLIMIT_NOFILE, CHILD_MAX_OPEN_FILES)
    _lower_limit(resource.RLIMIT_FSIZE, CHILD_MAX_FILE_BYTES)
    _lower_limit(resource.RLIMIT_NPROC, CHILD_MAX_PROCESSES)


def _lower_limit(kind: int, soft: int, hard: int | None = None) -> None:
    # Never above the limit inherited: an unprivileged process cannot raise a hard limit.
    _, inherited = resource.getrlimit(kind)
    hard = soft if hard is None else hard
    if inherited != resource.RLIM_INFINITY:
        soft, hard = min(soft, inherited), min(hard, inherited)
    resource.setrlimit(kind, (soft, hard))


def _resource_limits() -> dict:
    """The limits this child really runs under, read back from the kernel."""
    names = {"address_space_bytes": resource.RLIMIT_AS, "cpu_time_s": resource.RLIMIT_CPU,
             "open_files": resource.RLIMIT_NOFILE, "file_size_bytes": resource.RLIMIT_FSIZE,
             "processes": resource.RLIMIT_NPROC, "core_file_bytes": resource.RLIMIT_CORE}
    soft_limits = {name: resource.getrlimit(kind)[0] for name, kind in names.items()}
    return {name: None if value == resource.RLIM_INFINITY else value for name, value in soft_limits.items()}


def _claim_stdout():
    # Native libraries may print to fd 1; keep fd 1 for them (sent to stderr) and
    # write the one JSON answer to a private duplicate of the original stdout.
    result_fd = os.dup(sys.stdout.fileno())
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return os.fdopen(result_fd, "w")


class _ChildInspection:
    """One inspection: each ``_check_*`` step returns a message or raises _Refusal."""

    STEPS = ("parse", "external_data", "operator_domains", "checker", "tensor_ranks", "signature", "session", "smoke_run",
             "batch_sizes", "batchability")
    # Named in the refusal when a step raises what it does not expect.
    STEP_DESCRIPTIONS = {
        "parse": "reading the model", "external_data": "the external data check", "operator_domains": "the operator domain check",
        "checker": "the ONNX checker", "tensor_ranks": "the tensor rank check", "signature": "reading the signature",
        "session": "creating the ONNX Runtime session", "smoke_run": "the smoke run", "batch_sizes": "the runs at each batch size",
        "batchability": "the batchability check",
    }

    def __init__(self, source: BinaryIO, sha256: str | None, limits: ChildLimits):
        self.source = source
        self.sha256 = sha256
        self.limits = limits
        self.data = b""
        self.model: ModelProto | None = None
        self.signature: dict = {}
        self.session = None
        self.report: dict = {"checks": [], "artifact_size_bytes": None, "limits": _resource_limits()}

    def run(self) -> dict:
        try:
            for step in self.STEPS:
                self._run_step(step)
        except _Refusal as refusal:
            return {"ok": False, "status": refusal.status, "reason": refusal.reason, "report": self.report}
        self.report.update(_peak_memory())
        return {"ok": True, "signature": self.signature, "opset": self.signature["opset"],
                "producer": self.signature["producer"], "report": self.report}

    def _run_step(self, step: str) -> None:
        started = time.perf_counter()
        try:
            message = getattr(self, f"_check_{step}")()
        except MemoryError:
            refusal = _Refusal(_memory_reason(self.limits.memory_limit_bytes))
        except _Refusal as caught:
            refusal = caught
        except Exception as error:  # noqa: BLE001 - see _unexpected_refusal
            refusal = self._unexpected_refusal(step, error)
        else:
            self._record(step, True, message, started)
            return
        self._record(step, False, refusal.reason, started)
        raise refusal

    def _unexpected_refusal(self, step: str, error: Exception) -> _Refusal:
        # A hostile file reaches the onnx package and our checks with anything a protobuf can
        # hold, and they raise what they like (a ValueError for an unknown element type, a
        # TypeError for a name that is not UTF-8): refused, not a crash answered as our 500
        # and logged as an error with a traceback. The file is the only input of this child.
        if _mentions_memory_exhaustion(str(error)):
            return _Refusal(_memory_reason(self.limits.memory_limit_bytes))
        self.report["unexpected_error"] = {"step": step, "type": type(error).__name__}
        return _Refusal(f"{self.STEP_DESCRIPTIONS[step]} failed on this model: {_trim(error)}")

    def _record(self, step: str, ok: bool, message: str, started: float) -> None:
        elapsed_ms = round((time.perf_counter() - started) * 1000, 3)
        self.report["checks"].append({"name": step, "ok": ok, "message": message, "elapsed_ms": elapsed_ms})

    def _check_parse(self) -> str:
        self.data = self._read()
        self.report["artifact_size_bytes"] = len(self.data)
        self.model = _parse_model(self.data)
        _refuse_text_that_is_not_utf8(self.model)  # before any text is matched or written into the report
        _refuse_oversized_names(self.model)
        self.report.update(_model_facts(self.model))
        return f"parsed ONNX model, IR version {self.model.ir_version}"

    def _read(self) -> bytes:
        if self.sha256 is None:
            return self.source.read()
        try:
            return read_checked(self.source, self.sha256, "the stored upload")
        except UnsafeModel as changed:
            raise _Refusal(changed.reason, status=500) from None  # not the upload's bytes: no verdict on it

    def _check_external_data(self) -> str:
        try:
            refuse_external_references(self.model)
        except UnsafeModel as unsafe:
            raise _Refusal(unsafe.reason) from None
        return "every tensor, wherever it is in the file, is stored inside the file"

    def _check_operator_domains(self) -> str:
        _refuse_unknown_domains(self.model)
        return "every operator domain is provided by ONNX Runtime"

    def _check_checker(self) -> str:
        _run_onnx_checker(self.model)
        return "onnx.checker passed (full_check)"

    def _check_tensor_ranks(self) -> str:
        _refuse_deep_tensors(self.model)
        return f"no tensor, declared or inferred, has more than {MAX_TENSOR_RANK} dimensions"

    def _check_signature(self) -> str:
        self.signature = _build_signature(self.model)
        # The proto is no longer needed; free it before ORT makes its own copy.
        self.model = None
        return f"{len(self.signature['inputs'])} input(s), {len(self.signature['outputs'])} output(s)"

    def _check_session(self) -> str:
        self.session = _create_session(self.data)
        self.data = b""
        self.report["provider"] = self.session.get_providers()[0]
        return f"ONNX Runtime session created on {self.report['provider']}"

    def _check_smoke_run(self) -> str:
        output_shapes, elapsed_ms = _smoke_run(self.session, self.signature["inputs"])
        self.report["smoke_run_ms"] = round(elapsed_ms, 3)
        self.report["smoke_output_shapes"] = output_shapes
        _refuse_mismatched_outputs(self.signature["outputs"], output_shapes)
        return f"ran once on synthesised inputs in {elapsed_ms:.1f} ms"

    def _check_batch_sizes(self) -> str:
        # A worker warms every size up to the model's max batch size before routing it;
        # a model that cannot run those must fail here, not crash-loop every worker. Every
        # size up to 64, not a few: one that looped for ever at 17 rows passed 1, 2 and 32
        # and then held each worker's warm-up (bounded there by SERVING_WARM_TIMEOUT_S).
        # Past 64 only the max: every size to 1,024 took a 2.9M-parameter MLP 27 s, not 0.3.
        if not _has_batch_axis(self.signature["inputs"]):
            return "the first dimension is fixed: workers run it one request at a time"
        sizes = sorted({*range(2, min(self.limits.max_batch_size, EVERY_BATCH_SIZE_UP_TO) + 1), self.limits.max_batch_size} - {1})
        for rows in sizes:
            feeds = {spec["name"]: _synthetic_input(spec, rows) for spec in self.signature["inputs"]}
            try:
                shapes = dict(zip(_output_names(self.session), _run_for_output_shapes(self.session, feeds)))
            except _onnxruntime_errors() as error:
                _raise_runtime_refusal(f"ONNX Runtime failed to run the model at batch size {rows}", error)
            _refuse_mismatched_outputs(self.signature["outputs"], shapes, when=f"at batch size {rows}")
        self.report["batch_sizes_run"] = [1, *sizes]
        every = min(self.limits.max_batch_size, EVERY_BATCH_SIZE_UP_TO)
        rest = f" and at {self.limits.max_batch_size}" if self.limits.max_batch_size > every else ""
        return f"ran at every batch size from 1 to {every}{rest}"

    def _check_batchability(self) -> str:
        reason = _batchability_problem(self.session, self.signature)
        self.signature["batchable"] = reason is None
        self.report["batchable"] = reason is None
        if reason is None:
            return "batchable: two different rows give the same answers alone and batched together"
        self.report["not_batchable_reason"] = reason
        return f"not batchable, workers run it one request at a time: {reason}"


# -- parse


def _parse_model(data: bytes) -> ModelProto:
    if not data:
        raise _Refusal("the file is empty, not an ONNX model", status=400)
    if data[4:8] == ORT_FORMAT_ID:  # as the worker refuses it: what would run is not what is checked here
        raise _Refusal("the file is not an ONNX model: ONNX Runtime would read it as its ORT format (ORTM at byte 4)", status=400)
    try:
        # Always binary protobuf: onnx.load would guess a text format from the file name.
        model = onnx.load_model_from_string(data, format="protobuf")
    except (DecodeError, RuntimeError, ValueError) as error:
        raise _Refusal(f"the file is not an ONNX model: it is not a readable protobuf ({_trim(error)})", 400) from None
    if not model.ir_version or not model.HasField("graph"):
        # Protobuf parses many byte strings; a real model has a version and a graph.
        raise _Refusal("the file is not an ONNX model: it has no IR version or no graph", status=400)
    return model


@functools.cache
def _string_fields(descriptor) -> tuple[tuple[str, bool], ...]:
    """(name, is_repeated) of each text field; bytes fields (tensor data) are never read."""
    return tuple((field.name, field.is_repeated) for field in descriptor.fields if field.type == field.TYPE_STRING)


def _refuse_text_that_is_not_utf8(model: ModelProto) -> None:
    """ONNX's text fields are proto2 strings, which protobuf does not check: it hands over
    bytes where they are not UTF-8, and every name, matched, reported or sent to a worker,
    is text. Every field of every message, like the external-data walk."""
    for message in walk_messages(model):
        for name, is_repeated in _string_fields(message.DESCRIPTOR):
            values = getattr(message, name) if is_repeated else (getattr(message, name),)
            if any(isinstance(value, bytes) for value in values):
                raise _Refusal(f"the field '{name}' of a {message.DESCRIPTOR.name} holds bytes that are not UTF-8 text; "
                               "ONNX requires UTF-8")


def _refuse_oversized_names(model: ModelProto) -> None:
    """Names and lists that travel in every desired state (the signature) or into the
    report, bounded: a 20 MiB output name made every state sent to every worker 20 MB
    (past the 16 MiB a worker persists, so a worker restarted during a console outage
    served nothing), and 200,000 declared operator sets stored a 43 MB report."""
    if len(model.opset_import) > MAX_OPSET_IMPORTS:
        raise _Refusal(f"the model declares {len(model.opset_import)} operator sets, more than the limit {MAX_OPSET_IMPORTS}")
    initializers = {tensor.name for tensor in model.graph.initializer}  # listed as inputs by some exporters: weights, not inputs
    inputs = [value for value in model.graph.input if value.name not in initializers]
    for role, values in (("input", inputs), ("output", model.graph.output)):
        if len(values) > MAX_GRAPH_TENSORS:
            raise _Refusal(f"the model has {len(values)} {role}s, more than the limit {MAX_GRAPH_TENSORS}")
        for value in values:
            _refuse_long_name(f"an {role} name", value.name)
            for dimension in value.type.tensor_type.shape.dim:  # a symbolic dimension's name travels in the signature too
                _refuse_long_name(f"a dimension name of {role} '{_short_name(value.name)}'", dimension.dim_param)
    for entry in model.opset_import:
        _refuse_long_name("an operator set domain", entry.domain)
    for node in _all_nodes(model):
        _refuse_long_name("an operator domain", node.domain)


def _refuse_long_name(what: str, name: str) -> None:
    if len(name) > MAX_NAME_CHARS:
        raise _Refusal(f"{what} of {len(name)} characters ('{_short_name(name)}'), more than the limit {MAX_NAME_CHARS}")
    control = CONTROL_CHARACTERS.search(name)
    if control:  # shown on the version page and in clients' errors: an ESC or a right-to-left override disguised a name
        raise _Refusal(f"{what} holds the control character U+{ord(control.group()):04X}, which no name needs")


def _model_facts(model: ModelProto) -> dict:
    nodes = list(_all_nodes(model))
    return {
        "ir_version": model.ir_version,
        "opset_imports": {(entry.domain or "ai.onnx"): entry.version for entry in model.opset_import},
        "op_count": len(nodes),
        "domains": sorted({node.domain or "ai.onnx" for node in nodes}),
        "onnx_version": onnx.__version__,
    }


# -- every node, wherever it is (the same generic walk as the external-data check)


def _all_nodes(model: ModelProto) -> Iterator:
    return (message for message in walk_messages(model) if message.DESCRIPTOR.full_name == "onnx.NodeProto")


# -- operator domains


def _refuse_unknown_domains(model: ModelProto) -> None:
    allowed = ONNX_RUNTIME_DOMAINS | {function.domain for function in model.functions}
    for node in _all_nodes(model):
        if node.domain not in allowed:
            raise _Refusal(
                f"operator domain '{node.domain}' (op '{node.op_type}') is not provided by ONNX Runtime"
            )


def _run_onnx_checker(model: ModelProto) -> None:
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise _Refusal(f"the ONNX checker refused the model: {_trim(error)}") from None


# -- tensor ranks


def _refuse_deep_tensors(model: ModelProto) -> None:
    """Every tensor's rank: declared (graph inputs, outputs, value_info, initializers and
    constants, at any depth) and inferred by ONNX shape inference for the others."""
    for message in walk_messages(_with_inferred_shapes(model)):
        kind = message.DESCRIPTOR.full_name
        if kind == "onnx.ValueInfoProto":
            rank = max((len(tensor.shape.dim) for tensor in walk_messages(message.type)
                        if tensor.DESCRIPTOR.full_name in ("onnx.TypeProto.Tensor", "onnx.TypeProto.SparseTensor")), default=0)
        elif kind in ("onnx.TensorProto", "onnx.SparseTensorProto"):
            rank = len(message.dims)
        else:
            continue
        if rank > MAX_TENSOR_RANK:
            name = message.name if kind != "onnx.SparseTensorProto" else message.values.name
            raise _Refusal(f"tensor '{_short_name(name)}' has {rank} dimensions, more than the limit of {MAX_TENSOR_RANK} "
                           "(NumPy's, through which ONNX Runtime's Python API and every worker read tensors)")


def _with_inferred_shapes(model: ModelProto) -> ModelProto:
    """A copy of ``model`` with the value_info shape inference adds, without large weights
    anywhere: in the main graph, in every If, Loop or Scan body, and in every function (a
    copy with a branch's weights kept whole took 2.87 GB where the checker took 2.28)."""
    skeleton = ModelProto(ir_version=model.ir_version, opset_import=model.opset_import)
    skeleton.graph.CopyFrom(_graph_without_large_values(model.graph))
    for function in model.functions:
        copy = onnx.FunctionProto(name=function.name, domain=function.domain, input=function.input, output=function.output,
                                  attribute=function.attribute, attribute_proto=function.attribute_proto,
                                  opset_import=function.opset_import, value_info=function.value_info)
        copy.node.extend(_without_large_values(node) for node in function.node)
        skeleton.functions.append(copy)
    # Not strict: the checker has already run strict inference on the whole model; here a
    # stub's missing values only leave what depends on them uninferred.
    return onnx.shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False, data_prop=False)


def _graph_without_large_values(source: onnx.GraphProto) -> onnx.GraphProto:
    graph = onnx.GraphProto(name=source.name)
    for field in ("input", "output", "value_info"):
        getattr(graph, field).extend(getattr(source, field))
    graph.node.extend(_without_large_values(node) for node in source.node)
    graph.initializer.extend(_small_or_stub(tensor) for tensor in source.initializer)
    for sparse in source.sparse_initializer:
        graph.sparse_initializer.add(dims=sparse.dims, values=_small_or_stub(sparse.values), indices=_small_or_stub(sparse.indices))
    return graph


def _is_large(tensor: TensorProto) -> bool:
    return math.prod(tensor.dims) > INFERENCE_VALUE_ELEMENTS


def _small_or_stub(tensor: TensorProto) -> TensorProto:
    if not _is_large(tensor):
        return tensor
    return TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)


def _without_large_values(node) -> onnx.NodeProto:
    """``node``, its large tensor attributes (a Constant's weights) stubbed, and its bodies
    (If, Loop, Scan) copied without theirs."""
    if not any(attribute.type in _ATTRIBUTES_HOLDING_VALUES for attribute in node.attribute):
        return node
    stripped = onnx.NodeProto(input=node.input, output=node.output, name=node.name, op_type=node.op_type, domain=node.domain,
                              overload=node.overload)
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.TENSOR:
            stripped.attribute.add(name=attribute.name, type=attribute.type, t=_small_or_stub(attribute.t))
        elif attribute.type == onnx.AttributeProto.GRAPH:
            stripped.attribute.add(name=attribute.name, type=attribute.type, g=_graph_without_large_values(attribute.g))
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            stripped.attribute.add(name=attribute.name, type=attribute.type, graphs=[_graph_without_large_values(g) for g in attribute.graphs])
        else:
            stripped.attribute.append(attribute)
    return stripped


_ATTRIBUTES_HOLDING_VALUES = (onnx.AttributeProto.TENSOR, onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


# -- signature


def _build_signature(model: ModelProto) -> dict:
    """The signature (docs/architecture.md, contract 0) of a parsed model; raises _Refusal for non-tensors."""
    # Since IR 4 an initializer may also be listed as an input (an optional override);
    # clients never send those, so they are not part of the signature.
    initializer_names = {tensor.name for tensor in model.graph.initializer}
    inputs = [_tensor_spec(value, "input") for value in model.graph.input if value.name not in initializer_names]
    for spec in inputs:
        _refuse_unservable_datatype(spec)
        _refuse_unservable_dimensions(spec)
    outputs = [_tensor_spec(value, "output") for value in model.graph.output]
    for spec in outputs:
        _refuse_unservable_output(spec)
    _refuse_repeated_outputs(outputs)
    return {
        "inputs": inputs,
        "outputs": outputs,
        "opset": _default_opset(model),
        # Shown as it is on the version page: control characters dropped, like names never need them.
        "producer": CONTROL_CHARACTERS.sub("", f"{model.producer_name} {model.producer_version}").strip()[:PRODUCER_CHARS],
    }


def _tensor_spec(value, role: str) -> dict:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        described = _NON_TENSOR_KINDS.get(kind, f"a {kind}")
        raise _Refusal(f"only tensor inputs and outputs are supported: '{value.name}' is {described}")
    tensor_type = value.type.tensor_type
    if tensor_type.elem_type not in V2_DATATYPES:
        element = TensorProto.DataType.Name(tensor_type.elem_type)
        raise _Refusal(f"{role} '{value.name}' has element type {element}, which has no V2 datatype")
    if not tensor_type.HasField("shape"):
        raise _Refusal(f"{role} '{value.name}' has no declared shape (unknown rank); export it with a shape")
    shape = [_dimension(dimension) for dimension in tensor_type.shape.dim]
    return {"name": value.name, "datatype": V2_DATATYPES[tensor_type.elem_type], "shape": shape}


def _dimension(dimension) -> int | str | None:
    if dimension.HasField("dim_value"):
        return dimension.dim_value
    return dimension.dim_param or None


def _refuse_unservable_datatype(spec: dict) -> None:
    if spec["datatype"] not in SERVABLE_INPUT_DATATYPES:
        raise _Refusal(f"input '{_short_name(spec['name'])}' is {spec['datatype']}: workers decode only numeric and boolean "
                       f"inputs ({', '.join(sorted(SERVABLE_INPUT_DATATYPES))}), so this model could never be served")


def _refuse_unservable_output(spec: dict) -> None:
    # It passed as "ready": its benchmark failed, and every worker's ack of a state routing it failed.
    if spec["datatype"] in UNSERVABLE_OUTPUT_DATATYPES:
        raise _Refusal(f"output '{_short_name(spec['name'])}' is {spec['datatype']}: workers answer through NumPy, which has no "
                       "bfloat16, so this model could never be served; cast it to FP16 or FP32 in the graph")


def _refuse_repeated_outputs(outputs: list[dict]) -> None:
    # Clients ask for and read outputs by name: the V2 metadata listed a repeated one
    # twice, /predict answered one, and a request naming it got whichever came last.
    seen = set()
    for spec in outputs:
        if spec["name"] in seen:
            raise _Refusal(f"output '{_short_name(spec['name'])}' is listed twice among the model's outputs: "
                           "clients ask for outputs by name, so each must be listed once")
        seen.add(spec["name"])


def _refuse_unservable_dimensions(spec: dict) -> None:
    """Fixed dimensions must be positive and a request of one row must fit a worker."""
    name = _short_name(spec["name"])
    fixed = [dimension for dimension in spec["shape"] if isinstance(dimension, int)]
    for dimension in fixed:
        if dimension <= 0:
            raise _Refusal(f"input '{name}' declares a dimension of {dimension}: dimensions must be positive")
        if dimension > MAX_DIMENSION:
            raise _Refusal(f"input '{name}' declares a dimension of {dimension}, more than the limit {MAX_DIMENSION}")
    elements = math.prod(fixed)
    if elements > MAX_INPUT_ELEMENTS:
        raise _Refusal(f"input '{name}' declares {elements} elements per request, more than the limit {MAX_INPUT_ELEMENTS}")


def _short_name(name: str) -> str:
    return name if len(name) <= 80 else name[:77] + "..."


def _default_opset(model: ModelProto) -> int:
    versions = [entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")]
    return versions[0] if versions else 0


# -- ONNX Runtime


def _onnxruntime_errors() -> tuple[type[BaseException], ...]:
    # ORT's pybind exceptions share no base class below Exception; name them all.
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException",
             "InvalidProtobuf", "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail", "NotFound")
    return tuple(getattr(state, name) for name in names if hasattr(state, name)) + (RuntimeError, ValueError, TypeError)


def _create_session(data: bytes):
    # Imported here so that only the child process ever loads ONNX Runtime.
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only; warnings would flood the server log
    try:
        return onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except _onnxruntime_errors() as error:
        _raise_runtime_refusal("ONNX Runtime could not load the model", error, _load_hint(str(error)))


def _load_hint(message: str) -> str:
    """What to do about a version ONNX Runtime cannot load: the onnx package writes its newest
    IR version and opset by default, newer than an ONNX Runtime released before it loads
    (a newcomer's first model was refused twice, for each in turn)."""
    if "IR version" in message:
        return ("; save the model with an IR version at most the one named (with the onnx package: "
                "model.ir_version = N before onnx.save), and an ai.onnx opset this ONNX Runtime supports")
    if re.search(r"opset|official support for domain", message, re.IGNORECASE):
        return ("; save the model with an ai.onnx opset at most the one named (with the onnx package: "
                "helper.make_model(graph, opset_imports=[helper.make_opsetid('', N)]))")
    return ""


def _smoke_run(session, input_specs: list[dict]) -> tuple[dict, float]:
    feeds = {spec["name"]: _synthetic_input(spec) for spec in input_specs}
    started = time.perf_counter()
    try:
        shapes = _run_for_output_shapes(session, feeds)
    except _onnxruntime_errors() as error:
        _raise_runtime_refusal("ONNX Runtime failed to run the model on synthesised inputs", error)
    elapsed_ms = (time.perf_counter() - started) * 1000
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, shapes)), elapsed_ms


def _run_for_output_shapes(session, feeds: dict) -> list[list[int] | None]:
    # OrtValues carry BF16 both ways, which NumPy cannot; but ORT only takes string
    # inputs as NumPy arrays, so a model with string inputs runs through plain run().
    if any(isinstance(value, np.ndarray) and value.dtype == object for value in feeds.values()):
        return _run_with_numpy(session, feeds)
    import onnxruntime

    ort_feeds = {name: _as_ort_value(onnxruntime, value) for name, value in feeds.items()}
    return [list(output.shape()) for output in session.run_with_ort_values(None, ort_feeds)]


def _run_with_numpy(session, feeds: dict) -> list[list[int] | None]:
    # NumPy cannot hold BF16 outputs: those are left out of this run (shape None).
    names = [output.name for output in session.get_outputs()]
    wanted = [output.name for output in session.get_outputs() if output.type != "tensor(bfloat16)"]
    shapes = dict(zip(wanted, (list(np.shape(value)) for value in session.run(wanted, feeds))))
    return [shapes.get(name) for name in names]


def _as_ort_value(onnxruntime, value):
    if isinstance(value, onnxruntime.OrtValue):
        return value
    return onnxruntime.OrtValue.ortvalue_from_numpy(value)


def _output_names(session) -> list[str]:
    return [output.name for output in session.get_outputs()]


def _synthetic_input(spec: dict, rows: int = 1):
    """Zeros of the declared dtype; a dynamic first dimension gets ``rows``, every
    other symbolic or unknown dimension 1."""
    shape = [dimension if isinstance(dimension, int) else 1 for dimension in spec["shape"]]
    if shape and not isinstance(spec["shape"][0], int):
        shape[0] = rows
    if spec["datatype"] == "BYTES":
        return np.full(shape, "", dtype=object)
    array = np.zeros(shape, dtype=_NUMPY_DTYPES[spec["datatype"]])
    if spec["datatype"] == "BF16":
        import onnxruntime

        return onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(array, TensorProto.BFLOAT16)
    return array


def _refuse_mismatched_outputs(output_specs: list[dict], output_shapes: dict, when: str = "on the smoke run") -> None:
    # Workers split batches along the declared shapes, so a model that returns other
    # shapes than it declares cannot be served correctly.
    for spec in output_specs:
        actual = output_shapes.get(spec["name"])
        if actual is not None and not _shape_matches(spec["shape"], actual):
            raise _Refusal(
                f"output '{spec['name']}' has shape {actual} {when}, but the model declares {spec['shape']}"
            )


# -- batchability: proven by running, never assumed from a dynamic first dimension


def _has_batch_axis(input_specs: list[dict]) -> bool:
    return bool(input_specs) and all(spec["shape"] and not isinstance(spec["shape"][0], int) for spec in input_specs)


def _batchability_problem(session, signature: dict) -> str | None:
    """None when rows of different requests may share a batch; else why not.

    A dynamic first dimension is only a claim: a model that reduces over it, or a
    ``[seq, dim]`` model, answers each row with the others' data. So two different
    rows run alone and together; every output must have one row per input row, and
    each row of the joint run must equal that row's solo run.
    """
    if not signature["inputs"]:
        return "the model has no inputs"
    fixed = next((spec for spec in signature["inputs"] if not spec["shape"] or isinstance(spec["shape"][0], int)), None)
    if fixed is not None:
        return f"input '{_short_name(fixed['name'])}' has no dynamic first dimension"
    problem = _unprobeable_tensor(signature)
    if problem:
        return problem
    first, second = zip(*(_distinct_rows(spec) for spec in signature["inputs"]))
    together = tuple(np.concatenate(pair) for pair in zip(first, second))
    try:
        runs = [_run_values(session, signature["inputs"], feeds) for feeds in (first, second, together)]
    except _onnxruntime_errors() as error:
        return f"ONNX Runtime could not run two different rows: {_trim(error)}"
    for name, alone_first, alone_second, joint in zip(_output_names(session), *runs):
        problem = _row_problem(name, alone_first, alone_second, joint)
        if problem:
            return problem
    return None


def _unprobeable_tensor(signature: dict) -> str | None:
    # NumPy has no BF16, so those values cannot be compared: not proven, not batchable.
    for spec in signature["inputs"] + signature["outputs"]:
        if spec["datatype"] == "BF16":
            return f"'{_short_name(spec['name'])}' is BF16, whose values this check cannot compare"
    return None


def _distinct_rows(spec: dict) -> tuple[np.ndarray, np.ndarray]:
    """Two one-row inputs that differ everywhere (equal rows would hide a mean over the batch)."""
    shape = [1] + [dimension if isinstance(dimension, int) else 1 for dimension in spec["shape"][1:]]
    datatype = spec["datatype"]
    if datatype == "BYTES":
        return np.full(shape, "a", dtype=object), np.full(shape, "b", dtype=object)
    dtype = np.dtype(_NUMPY_DTYPES[datatype])
    if dtype.kind == "f":
        rng = np.random.default_rng(0)
        return rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype) + 1
    return np.zeros(shape, dtype), np.ones(shape, dtype)


def _run_values(session, input_specs: list[dict], arrays: tuple) -> list[np.ndarray]:
    feeds = {spec["name"]: array for spec, array in zip(input_specs, arrays)}
    return [np.asarray(value) for value in session.run(None, feeds)]


def _row_problem(name: str, alone_first: np.ndarray, alone_second: np.ndarray, joint: np.ndarray) -> str | None:
    rows = [array.shape[0] if array.ndim else 0 for array in (alone_first, alone_second, joint)]
    if rows != [1, 1, 2]:
        return (f"output '{_short_name(name)}' does not follow the batch: {rows[0]} row(s) for one input row, "
                f"{rows[2]} for two")
    if not (_same_values(joint[:1], alone_first) and _same_values(joint[1:], alone_second)):
        return f"output '{_short_name(name)}' changes for one row when another row is batched with it"
    return None


def _same_values(batched: np.ndarray, alone: np.ndarray) -> bool:
    if batched.shape != alone.shape:
        return False
    if batched.dtype.kind not in "fc":
        return bool(np.array_equal(batched, alone))
    rtol, atol = FLOAT_TOLERANCE.get(batched.dtype.type, DEFAULT_TOLERANCE)
    return bool(np.allclose(batched, alone, rtol=rtol, atol=atol, equal_nan=True))


def _shape_matches(declared: list, actual: list[int]) -> bool:
    if len(declared) != len(actual):
        return False
    return all(not isinstance(expected, int) or expected == got for expected, got in zip(declared, actual))


def _raise_runtime_refusal(what: str, error: BaseException, hint: str = "") -> None:
    # ORT turns a failed allocation under RLIMIT_AS into an ordinary error; report it
    # as the memory limit it is (the step runner words MemoryError).
    if _mentions_memory_exhaustion(str(error)):
        raise MemoryError(_trim(error)) from None
    raise _Refusal(f"{what}: {_trim(error)}{hint}") from None


_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
# "/onnxruntime_src/.../reshape_helper.h:91 onnxruntime::ReshapeHelper::ReshapeHelper(...) "
_SOURCE_LOCATION = re.compile(r"(?:/[\w.+-]+)+\.(?:h|hpp|cc|cpp|cu):\d+ ")
# "void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*) "
_CPP_FUNCTION = re.compile(r"(?:\w+\*? )?onnxruntime::[\w:~<>]+\([^)]*\)(?: const)? ")


def _trim(error: BaseException) -> str:
    """One readable line: no ORT code prefix, no source locations, no newlines, short."""
    text = _ORT_PREFIX.sub("", " ".join(str(error).split()))
    text = _CPP_FUNCTION.sub("", _SOURCE_LOCATION.sub("", text))
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 3].rstrip() + "..."
    return text or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
