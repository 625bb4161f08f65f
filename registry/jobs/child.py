"""A job's ONNX work runs in a fresh interpreter: ``python -m serving.jobs <command> …``.

Why a child: the model runs native code that may crash or allocate without bound, and
a batch job must be stoppable within a second. The child gets a minimal environment
(no database URL, secret or token; the ``SERVING_*`` settings, so its ONNX Runtime
session uses the worker's own options), an address-space limit and no core files
(``prlimit``), a nice level (``nice``), and dies with the Celery process that started
it (``setpriv --pdeathsig``: a killed Celery worker leaves no orphan computing). Its
stdout carries JSON lines: progress, then one result or one error.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

from registry.jobs import records
from registry.jobs.runner import JobCancelled, JobFailed

logger = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.25
STOP_GRACE_S = 0.5
MAX_LINE_BYTES = 1 << 20
INHERITED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH", "TZ", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
# The token, and the file holding it (serving/env.py reads NAME_FILE first): a child that
# loads an uploaded model is told neither where the secret is nor what it is.
SECRET_SERVING_VARIABLES = {"SERVING_WORKER_TOKEN", "SERVING_WORKER_TOKEN_FILE"}
CHILD_MAX_FILE_BYTES = 8 * 1024 * 1024  # a benchmark or an evaluation writes no file of its own


def run_child(job, argv: list[str], *, memory_limit_bytes: int | None = None, nice: int = 0, timeout_s: float,
              max_file_bytes: int | None = None, stdin: BinaryIO | None = None) -> dict:
    """Run ``python -m serving.jobs *argv``; return its result, reporting its progress on
    ``job``. Raises JobFailed (an error event, a crash, the time limit) or JobCancelled.
    ``max_file_bytes`` caps every file the child writes (RLIMIT_FSIZE): a small file that
    declares billions of rows (a compressed .npz) must not fill the disk with outputs.
    ``stdin``: an opened file the child reads (its model, ``versions.opened_artifact``)."""
    with tempfile.TemporaryDirectory(prefix="modelops-job-", ignore_cleanup_errors=True) as private:
        stderr_path = Path(private) / "stderr"
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(command(argv, memory_limit_bytes, nice, max_file_bytes), cwd=private, env=environment(private),
                                       stdin=stdin or subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr)
        try:
            outcome = _follow(job, process, timeout_s)
        finally:
            _stop(process)
        return _result(outcome, process.returncode, _tail(stderr_path), memory_limit_bytes, max_file_bytes)


def command(argv: list[str], memory_limit_bytes: int | None, nice: int, max_file_bytes: int | None = None) -> list[str]:
    prefix: list[str] = []
    if shutil.which("setpriv"):
        prefix += ["setpriv", "--pdeathsig", "KILL", "--"]
    if shutil.which("prlimit"):
        limits = [*([f"--as={memory_limit_bytes}"] if memory_limit_bytes else []), *([f"--fsize={max_file_bytes}"] if max_file_bytes else [])]
        prefix += ["prlimit", "--core=0", *limits, "--"]
    if nice:
        prefix += ["nice", "-n", str(nice)]
    # -P: the private working directory is not put on sys.path; PYTHONPATH names the code.
    return [*prefix, sys.executable, "-P", "-m", "serving.jobs", *argv]


def environment(private: str) -> dict[str, str]:
    chosen = {name: os.environ[name] for name in INHERITED if name in os.environ}
    chosen.update({name: value for name, value in os.environ.items()
                   if name.startswith("SERVING_") and name not in SECRET_SERVING_VARIABLES})
    chosen.setdefault("PATH", os.defpath)
    chosen.update(MALLOC_ARENA_MAX="2", PYTHONPATH=str(PROJECT_ROOT), PYTHONDONTWRITEBYTECODE="1",
                  HOME=private, TMPDIR=private, PYTHONUNBUFFERED="1")
    return chosen


def _follow(job, process: subprocess.Popen, timeout_s: float) -> dict:
    """Read events until the child closes its stdout; poll for cancel and the deadline."""
    deadline = time.monotonic() + timeout_s
    outcome: dict = {}
    pending = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            if selector.select(timeout=POLL_S):
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:  # the child closed its stdout: it is exiting
                    _wait_for_exit(process)
                    return outcome
                pending = _take_lines(job, pending + chunk, outcome)
            if records.cancel_requested(job):
                raise JobCancelled()
            if time.monotonic() > deadline:
                raise JobFailed(f"the job ran past its time limit of {timeout_s:g} s (JOB_TIMEOUT_S)")


def _take_lines(job, data: bytes, outcome: dict) -> bytes:
    *lines, rest = data.split(b"\n")
    for line in lines:
        _take_event(job, line, outcome)
    if len(rest) > MAX_LINE_BYTES:  # not our protocol: something else wrote to stdout
        rest = b""
    return rest


def _take_event(job, line: bytes, outcome: dict) -> None:
    try:
        event = json.loads(line)
    except ValueError:
        return  # native code printing to stdout; the protocol's lines are all JSON
    if not isinstance(event, dict):
        return
    kind = event.get("event")
    if kind == "progress" and isinstance(event.get("done"), int):
        total = event.get("total")
        records.progress(job, event["done"], total if isinstance(total, int) else None)
    elif kind == "result" and isinstance(event.get("result"), dict):
        outcome["result"] = event["result"]
    elif kind == "error":
        outcome["error"] = str(event.get("reason") or "the job's input was refused")[:2000]


def _result(outcome: dict, returncode: int | None, stderr: str, memory_limit_bytes: int | None, max_file_bytes: int | None = None) -> dict:
    if "error" in outcome:
        raise JobFailed(outcome["error"])
    if returncode == 0 and "result" in outcome:
        return outcome["result"]
    if any(marker in stderr for marker in ("MemoryError", "bad_alloc", "Failed to allocate memory")):
        limit = f" of {memory_limit_bytes / 2**30:.1f} GiB" if memory_limit_bytes else ""
        raise JobFailed(f"the job ran out of memory: it needs more than its memory limit{limit} (JOB_MEMORY_LIMIT_BYTES)")
    if returncode == -signal.SIGXFSZ or "File too large" in stderr:
        raise JobFailed(f"the job's output grew past its limit of {max_file_bytes or 0} bytes (JOB_MAX_OUTPUT_BYTES)")
    if returncode is not None and returncode < 0:
        raise JobFailed(f"the job's process was killed by {signal.Signals(-returncode).name}")
    logger.error("job child exited with %s: %s", returncode, stderr)
    last = stderr.strip().splitlines()[-1:] or ["no message"]
    raise JobFailed(f"the job's process failed (exit code {returncode}): {last[0][:300]}")


def _wait_for_exit(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass  # _stop ends it


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout:
        process.stdout.close()


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - limit))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
