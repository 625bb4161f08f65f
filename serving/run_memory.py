"""A bound on the memory a worker's model runs take, and giving it back afterwards.

A model's weights are bounded by its file, and a request's input by the body and element
limits, but the tensors a run computes are not: a model whose intermediate sizes follow
an input's *values* (an Expand or ConstantOfShape to a size read from it) passed
inspection, which runs small inputs, and then let one 40-byte request take a worker from
181 MB to 2.58 GB, kept until the model was unloaded (an audit, 3 Dec). Enough of those
and the kernel's OOM killer ends the worker, and every request on it.

So every CPU session of the process allocates from one ONNX Runtime arena, registered in
its environment and capped at ``SERVING_RUN_MEMORY_MB`` (by default half the memory the
process may use: its cgroup's limit, else the machine's). Weights are not drawn from it
(a 300 MB initializer loads under a 256 MB cap). A run that would pass the cap fails
inside ONNX Runtime, the batch is split until that request fails alone
(serving/batch_run.py), and `refusal` names the answer: 413 when the request needs more
than the cap by itself, 503 when others hold the memory for now. A batch at most once a
second also asks ONNX Runtime to hand the arena's free regions back to the system, so a
large run's memory does not stay resident.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time

import onnxruntime as ort

from serving.errors import PayloadTooLarge, RunMemoryBusy, ServingError
from serving.logs import event

logger = logging.getLogger("serving.run_memory")

MIB = 1024 * 1024
DEFAULT_SHARE = 0.5  # of the memory the process may use, when SERVING_RUN_MEMORY_MB is not set
SHRINK_EVERY_S = 1.0
_SHRINK_ENTRY = ("memory.enable_memory_arena_shrinkage", "cpu:0")
# bfc_arena.cc: "Available memory of 263192320 is smaller than requested bytes of 2048000000"
_EXHAUSTED = re.compile(r"Available memory of (\d+) is smaller than requested bytes of (\d+)")

_lock = threading.Lock()
_installed_limit: int | None = None
_last_shrink_s = 0.0


def limit_bytes(configured_mb: int) -> int:
    """The cap: ``configured_mb`` MiB, or the default share when it is 0."""
    if configured_mb:
        return configured_mb * MIB
    return int(available_bytes() * DEFAULT_SHARE)


def available_bytes() -> int:
    """The memory this process may use: its cgroup's limit when it has one, else the machine's."""
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(machine, _cgroup_limit() or machine)


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def install(configured_mb: int) -> int:
    """Register the capped arena, once per process; returns the cap in bytes. A later call
    asking another cap gets the first one (ONNX Runtime's environment is per process)."""
    global _installed_limit
    with _lock:
        if _installed_limit is None:
            limit = limit_bytes(configured_mb)
            arena = ort.OrtArenaCfg(limit, -1, -1, -1)
            memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator(memory, arena)
            _installed_limit = limit
            logger.info(event("run_memory_capped", limit_mb=limit // MIB))
        elif limit_bytes(configured_mb) != _installed_limit:
            logger.warning(event("run_memory_cap_kept", limit_mb=_installed_limit // MIB, asked_mb=limit_bytes(configured_mb) // MIB))
        return _installed_limit


def use_capped_arena(options: ort.SessionOptions, configured_mb: int) -> None:
    """Make a session allocate its run tensors from the process's capped arena."""
    install(configured_mb)
    options.add_session_config_entry("session.use_env_allocators", "1")


def add_shrink_when_due(options: ort.RunOptions, now_s: float | None = None) -> bool:
    """At most once every SHRINK_EVERY_S, make this run give the arena's free regions back
    when it ends (any session's run shrinks the shared arena). Cheap, but not free on
    every run: freed regions are allocated again by the next one."""
    global _last_shrink_s
    now_s = time.monotonic() if now_s is None else now_s
    if now_s - _last_shrink_s < SHRINK_EVERY_S:
        return False
    _last_shrink_s = now_s
    options.add_run_config_entry(*_SHRINK_ENTRY)
    return True


def refusal(error: Exception, limit: int | None = None) -> ServingError | None:
    """The answer to a run that failed for want of arena memory, or None for any other
    failure. ``limit``: the cap in bytes, by default the one installed."""
    found = _EXHAUSTED.search(str(error))
    if found is None:
        return None
    requested = int(found.group(2))
    limit = limit or _installed_limit or 0
    if limit and requested > limit:
        return PayloadTooLarge(
            f"this input needs {_mib(requested)} MiB at once inside the model, more than the worker allows "
            f"for all runs together ({_mib(limit)} MiB, SERVING_RUN_MEMORY_MB)"
        )
    return RunMemoryBusy(
        f"the worker's run memory is in use by other requests ({_mib(int(found.group(1)))} MiB free, "
        f"{_mib(requested)} MiB needed); try again"
    )


def _mib(size: int) -> str:
    return f"{size / MIB:.0f}" if size >= MIB else f"{size / MIB:.2f}"
