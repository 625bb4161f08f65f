"""The benchmark job: samples per second and latency of a ready version at batch sizes
1, 8, 32 and the model's max batch size, kept in ``version.metrics["benchmark"]``.

Benchmarks run one at a time across every Celery process on the host (an exclusive
``flock`` on ``$DATA_DIR/benchmark.lock``): two at once would each measure half a
machine. A job waits for the lock as long as it takes (the runner's heartbeat thread
keeps it alive meanwhile) and stops waiting when it is cancelled. Its child runs at
``BENCHMARK_NICE`` so it yields the CPU to serving on a shared host.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from registry.jobs import records
from registry.jobs.child import CHILD_MAX_FILE_BYTES, run_child
from registry.jobs.runner import JobCancelled
from registry.jobs.versions import (
    measured,
    memory_limit_bytes,
    model_arguments,
    opened_artifact,
    store_metric,
)

LOCK_POLL_S = 0.25


def run(job) -> dict:
    version = job.version
    with opened_artifact(version) as model:
        max_batch_size = version.model.max_batch_size or settings.SERVING_DEFAULT_MAX_BATCH_SIZE
        argv = ["benchmark", *model_arguments(version), "--max-batch-size", str(max_batch_size),
                "--seconds-per-size", str(settings.BENCHMARK_SECONDS_PER_SIZE)]
        with exclusive_slot(job, Path(settings.DATA_DIR) / "benchmark.lock"):
            result = run_child(job, argv, memory_limit_bytes=memory_limit_bytes(version), nice=settings.BENCHMARK_NICE,
                               timeout_s=settings.JOB_TIMEOUT_S, max_file_bytes=CHILD_MAX_FILE_BYTES, stdin=model)
    store_metric(version, "benchmark", measured(result, job))
    return result


@contextlib.contextmanager
def exclusive_slot(job, path: Path) -> Iterator[None]:
    """Hold the lock on ``path``, waiting for it; JobCancelled if the job is cancelled
    while it waits. The kernel drops the lock when its holder exits, however it exits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if records.cancel_requested(job):
                    raise JobCancelled() from None
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
