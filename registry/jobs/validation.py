"""The validation job: the inspection of an upload answered with 202, off the request.

The upload stored the bytes and a ``validating`` version (``actions.uploads.accept_staged``).
This handler waits for a free inspection slot (polling; the request path answered 503
instead), runs the sandboxed inspection child on the stored bytes and records the
verdict: ``ready`` or ``rejected`` (``uploads.mark_ready`` / ``mark_rejected``, each a
conditional change of a ``validating`` row, so a job run twice gives one verdict, one
route and one audit event). The job *succeeds* whenever the inspection gave a verdict
(``result = {"verdict", "reason"}``); it fails only when the inspection could not run,
and then ``ended_without_success`` rejects the version saying so. A cancel stops it while
it waits for a slot or while the inspection child runs (the child is killed).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from django.conf import settings
from django.db import DatabaseError

from registry.actions import uploads
from registry.artifacts import storage
from registry.artifacts.inspection import (
    InspectionError,
    InspectionStopped,
    inspection_slot,
)
from registry.db_unavailable import is_lock_timeout
from registry.domain.choices import JobStatus, VersionStatus
from registry.jobs import records
from registry.jobs.runner import JobCancelled, JobFailed, JobRetry
from registry.models import Job, ModelVersion

SLOT_POLL_S = 0.5
# The inspection's steps, reported as progress: waiting for a slot, then inspecting.
STEPS = 2


def run(job: Job) -> dict:
    version = ModelVersion.objects.select_related("model").get(pk=job.version_id)
    if version.status != VersionStatus.VALIDATING:  # judged by an earlier run of this job
        return _verdict(version)
    if not storage.exists(version.sha256):
        raise JobFailed("the uploaded bytes are no longer in the artifact store")
    records.progress(job, 0, STEPS, force=True)
    try:
        with _free_slot(job):
            records.progress(job, 1, STEPS, force=True)
            report = uploads.inspect_stored(version, should_stop=lambda: records.cancel_requested(job))
    except InspectionStopped:
        raise JobCancelled() from None
    except InspectionError as error:
        if error.status >= 500:  # the inspection itself failed: no verdict on the model
            raise JobFailed(f"the inspection failed: {error.reason}") from None
        uploads.mark_rejected(version, error.reason, error.report)
    else:
        _record_ready(version, report)
    version.refresh_from_db()
    return _verdict(version)


def _record_ready(version: ModelVersion, report) -> None:
    """Ready, with its route and jobs, or nothing: a row lock another change held past
    DATABASE_LOCK_TIMEOUT_S is met again by a later attempt, not a verdict on the model."""
    try:
        uploads.mark_ready(version, report)
    except DatabaseError as error:
        if not is_lock_timeout(error):
            raise
        raise JobRetry("the inspection passed, but the verdict could not be recorded: another change held a row lock it "
                       "needs (the generation's, the model's or the version's) past DATABASE_LOCK_TIMEOUT_S") from None


def ended_without_success(job: Job) -> None:
    """A validation job failed or was cancelled (its handler, the stale sweep, a
    cancel): its version must not stay ``validating``."""
    if job.version_id is None:
        return
    version = ModelVersion.objects.filter(pk=job.version_id).first()
    if version is None:
        return
    what = "validation was cancelled" if job.status == JobStatus.CANCELLED else f"validation could not run: {job.error or 'no reason given'}"
    uploads.mark_rejected(version, what, version.validation_report, actor=job.cancelled_by if job.status == JobStatus.CANCELLED else None)


def _verdict(version: ModelVersion) -> dict:
    return {"verdict": version.status, "reason": version.status_reason}


@contextlib.contextmanager
def _free_slot(job: Job) -> Iterator[None]:
    """Hold an inspection slot, polling until one is free; a cancel stops the wait."""
    with contextlib.ExitStack() as held:
        while True:
            try:
                held.enter_context(inspection_slot(settings.DATA_DIR / "inspection-slots", settings.INSPECTION_MAX_CONCURRENT))
                break
            except InspectionError as busy:
                if busy.retry_after_s is None:
                    raise
            if records.cancel_requested(job):
                raise JobCancelled()
            records.heartbeat(job)
            time.sleep(SLOT_POLL_S)
        yield
