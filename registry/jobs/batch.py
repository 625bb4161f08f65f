"""The batch-inference job: a version run over an uploaded file (``.npy``, ``.npz``,
``.jsonl``, ``.csv``), written to an output file of the same family.

The child writes ``output.<attempt>-<claim time>.pending`` (through ``.part`` and scratch
files of its own), renamed to ``files.output_path`` once the result names the output's
format, by a runner that still holds the job. The name is the claim's own: a runner the
sweep took for lost (stopped, not dead) may still have a child writing when the job runs
again, and with one name for both the first child to finish renamed the other's ``.part``
away, failing the rerun ("No such file or directory"). When the job ends, however it ends,
everything else in its folder goes, the input first: nothing reads it again, and it can
be as large as ``JOB_MAX_INPUT_BYTES``. A corrupt file fails
the job with the child's reason.
"""

from __future__ import annotations

import os

from django.conf import settings
from django.db import transaction

from registry.jobs import files, records
from registry.jobs.child import run_child
from registry.jobs.runner import JobFailed
from registry.jobs.versions import memory_limit_bytes, model_arguments, opened_artifact

MAX_BATCH_SIZE = 4096  # rows per model call; BATCH_JOB_BATCH_SIZE is bounded the same


def run(job) -> dict:
    try:
        return _run(job)
    finally:
        if _still_held(job):
            remove_all_but_output(job)
        else:  # a runner that lost the job must not take the rerun's input: only its own files go
            for path in files.job_dir(job).glob(f"{_pending_name(job)}*"):
                path.unlink(missing_ok=True)


def _pending_name(job) -> str:
    """This claim's own output file (and, with suffixes, its child's ``.part`` and scratch)."""
    return f"output.{job.attempts}-{job.started_at.timestamp():.6f}.pending"


def _run(job) -> dict:
    version = job.version
    with opened_artifact(version) as model:
        source = files.input_path(job)
        if not job.input_format or not source.is_file():
            raise JobFailed("the job's input file is gone (it is deleted once a batch job ends)")
        pending = files.job_dir(job) / _pending_name(job)
        batch_size = int(job.params.get("batch_size") or settings.BATCH_JOB_BATCH_SIZE)
        argv = ["batch", *model_arguments(version), "--input", str(source), "--format", job.input_format,
                "--output", str(pending), "--batch-size", str(batch_size)]
        result = run_child(job, argv, memory_limit_bytes=memory_limit_bytes(version), nice=settings.JOB_NICE, timeout_s=settings.JOB_TIMEOUT_S,
                           max_file_bytes=settings.JOB_MAX_OUTPUT_BYTES, stdin=model)
    _keep_output(job, pending, result)
    return result


def _keep_output(job, pending, result: dict) -> None:
    output_format = str(result.get("output_format") or "")
    if not _still_held(job):  # swept while it ran: the job is another runner's now, and so is its output
        raise _lost(pending)
    if output_format not in {"npy", "npz", "jsonl", "csv"} or not pending.is_file():
        raise JobFailed("the job's process finished without writing its output file")
    job.output_format, job.output_bytes = output_format, pending.stat().st_size
    # The claim and the rename are one step: the sweep, taking the job between a check and
    # the rename, waits on the row until both are done, or finds them undone.
    with transaction.atomic():
        if _held(job).update(output_format=job.output_format, output_bytes=job.output_bytes) != 1:
            raise _lost(pending)
        os.replace(pending, files.output_path(job))


def _lost(pending) -> JobFailed:
    pending.unlink(missing_ok=True)
    return JobFailed("this runner no longer holds the job (it was queued again or finished elsewhere)")


def _held(job):
    return records.held(job)


def _still_held(job) -> bool:
    return _held(job).exists()


def remove_all_but_output(job) -> None:
    """The input, and whatever a stopped child left (its ``.part`` and scratch files)."""
    folder = files.job_dir(job)
    keep = files.output_path(job) if job.output_format else None
    for path in folder.iterdir() if folder.is_dir() else ():
        if path != keep and path.is_file():
            path.unlink(missing_ok=True)


def ended_without_success(job) -> None:
    """A batch job cancelled or failed, by its runner or by the sweep: only an output
    could be worth keeping, and it has none."""
    files.remove_job_files(job)
