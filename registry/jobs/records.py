"""A job's life: created (queued, sent to Celery after commit), claimed (running, with a
heartbeat), progressing, and finished (succeeded, failed or cancelled).

Every transition is one conditional UPDATE on the row, so two runners of the same job
(a Celery message delivered twice, a runner that outlived its heartbeat) cannot both
finish it: the one whose claim is no longer current writes nothing. Each transition is
relayed to browsers over the live websocket.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, ExpressionWrapper
from django.db.models.functions import Now
from django.utils import timezone
from django.utils.module_loading import import_string

from registry.actions import events
from registry.broadcast import send_to_group
from registry.domain.choices import TERMINAL_JOB_STATUSES, JobStatus
from registry.fleet.live import LIVE_GROUP
from registry.models import Job

logger = logging.getLogger(__name__)
PROGRESS_WRITE_INTERVAL_S = 0.5
# Called with the job when a job of that kind ends failed or cancelled, however it ended
# (its handler, the sweep): what the job was for must not stay half-done (a version
# left "validating" forever).
ENDED_WITHOUT_SUCCESS_HOOKS = {
    "validation": "registry.jobs.validation.ended_without_success",
    "batch": "registry.jobs.batch.ended_without_success",  # its input file goes
}
UNSENT_GRACE_S = 5.0


def create(kind, model, *, version=None, dataset=None, key=None, params=None, created_by=None,
           input_format: str = "", input_name: str = "", send: bool = True) -> Job:
    """A queued job, sent to Celery once the caller's transaction commits. With a ``key``
    that a job already has, that job is returned and nothing new is queued. ``send=False``
    lets the caller store the job's input first, then call ``enqueue``."""
    if key is not None and (existing := Job.objects.filter(key=key).first()) is not None:
        return existing
    user = created_by if created_by is not None and created_by.is_authenticated else None
    try:
        with transaction.atomic():
            job = Job.objects.create(kind=kind, model=model, version=version, dataset=dataset, key=key, params=params or {},
                                     created_by=user, input_format=input_format, input_name=input_name[:255])
    except IntegrityError:  # the same key, created meanwhile by a concurrent caller
        return Job.objects.get(key=key)
    if send:
        enqueue(job)
    return job


def enqueue(job: Job) -> None:
    """Send ``run_job`` after commit. A send that fails (broker down) leaves the job queued
    with no ``heartbeat_at``; ``sweep_stale`` sends it again."""
    transaction.on_commit(lambda: _send(job.pk))


def _send(job_id: int) -> None:
    # Imported here: registry.tasks imports this module.
    from registry import tasks

    try:
        tasks.run_job.delay(job_id)
    except Exception as error:  # kombu raises many kinds of connection errors
        # Its cause in one line: a full Redis wrote a 100-line traceback per job sent.
        logger.warning("could not send job %s to Celery (%s: %s); the sweep will retry", job_id, type(error).__name__,
                       str(error).splitlines()[0][:200] if str(error) else "no message")
        logger.debug("the send of job %s failed", job_id, exc_info=True)
        return
    Job.objects.filter(pk=job_id, status=JobStatus.QUEUED).update(heartbeat_at=Now())


def claim(job_id: int) -> Job | None:
    """Mark a queued job running for this runner and return it; None when there is
    nothing to run (unknown, finished, cancelled, or running elsewhere)."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.status != JobStatus.QUEUED:
            return None
        now = timezone.now()
        if job.cancel_requested:
            _set(job, status=JobStatus.CANCELLED, finished_at=now, error="cancelled before it started")
            transaction.on_commit(lambda: _ended_without_success(job))
            return None
        _set(job, status=JobStatus.RUNNING, attempts=job.attempts + 1, started_at=now, heartbeat_at=Now(),
             done=0, rate_per_s=None, error="")
        job.refresh_from_db(fields=["heartbeat_at"])
    job._progress_origin = (time.monotonic(), 0)
    job._progress_written_at = 0.0
    relay(job)
    return job


def _set(job: Job, **fields) -> None:
    for name, value in fields.items():
        setattr(job, name, value)
    job.save(update_fields=list(fields))


def held(job: Job):
    """This runner's claim: the row is still running under the attempt it claimed, started
    when it claimed it (an attempt given back after an outage is claimed again under the
    same number, by another runner)."""
    return Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, attempts=job.attempts, started_at=job.started_at)


def progress(job: Job, done: int, total: int | None = None, *, force: bool = False) -> bool:
    """Record progress (written and relayed at most every 0.5 s). False when this runner
    no longer holds the job (it was swept, or finished elsewhere)."""
    job.done = max(0, int(done))
    if total is not None:
        job.total = max(0, int(total))
    origin_s, origin_done = getattr(job, "_progress_origin", (time.monotonic(), 0))
    elapsed_s = time.monotonic() - origin_s
    if elapsed_s > 0 and job.done > origin_done:
        job.rate_per_s = (job.done - origin_done) / elapsed_s
    now_s = time.monotonic()
    if not force and now_s - getattr(job, "_progress_written_at", 0.0) < PROGRESS_WRITE_INTERVAL_S:
        return True
    job._progress_written_at = now_s
    still_held = held(job).update(done=job.done, total=job.total, rate_per_s=job.rate_per_s, heartbeat_at=Now()) == 1
    if still_held:
        relay(job)
    return still_held


def heartbeat(job: Job) -> bool:
    return held(job).update(heartbeat_at=Now()) == 1


def cancel_requested(job: Job) -> bool:
    return Job.objects.filter(pk=job.pk, cancel_requested=True).exists()


def give_back(job: Job) -> None:
    """Queue a job this runner still holds again, its attempt not counted (a database
    outage stopped it, not the job), and send it; nothing when it is no longer this
    runner's (swept, cancelled or finished elsewhere)."""
    _queue_again(job, f"attempt {job.attempts} was interrupted by a database outage; queued again", attempts=job.attempts - 1)


def _queue_again(job: Job, note: str, **fields) -> bool:
    """Queue again a job this runner holds, saying why, and send it; False when it is no
    longer this runner's."""
    if held(job).update(status=JobStatus.QUEUED, heartbeat_at=None, error=note[:4000], **fields) != 1:
        return False
    job.refresh_from_db()
    logger.warning("job %s: %s", job.pk, note)
    relay(job)
    _send(job.pk)
    return True


def succeed(job: Job, result: dict, **fields) -> bool:
    # The total the job's last progress said (a .csv's header is no row), which a write
    # held back by PROGRESS_WRITE_INTERVAL_S had not stored: "22 / 23 (95%)" when done.
    done = job.total if job.total is not None else job.done
    return _finish(job, JobStatus.SUCCEEDED, result=result, done=done, total=done, **fields)


def try_again(job: Job, reason: str) -> bool:
    """Queue a job this runner holds again, its attempt counted, and send it; failed with
    ``reason`` once it has used JOB_MAX_ATTEMPTS."""
    if job.attempts >= settings.JOB_MAX_ATTEMPTS:
        return fail(job, f"{reason} (after {job.attempts} attempts)")
    return _queue_again(job, f"attempt {job.attempts}: {reason}; queued again")


def fail(job: Job, reason: str) -> bool:
    return _finish(job, JobStatus.FAILED, error=reason[:4000])


def cancelled(job: Job) -> bool:
    return _finish(job, JobStatus.CANCELLED, error="cancelled")


def _finish(job: Job, status: str, **fields) -> bool:
    fields.update(status=status, finished_at=timezone.now())
    if job.rate_per_s is not None:
        fields.setdefault("rate_per_s", job.rate_per_s)
    if held(job).update(**fields) != 1:
        logger.info("job %s finished as %s by a runner that no longer held it; ignored", job.pk, status)
        return False
    for name, value in fields.items():
        setattr(job, name, value)
    relay(job)
    if status != JobStatus.SUCCEEDED:
        _ended_without_success(job)
    return True


def _ended_without_success(job: Job) -> None:
    hook = ENDED_WITHOUT_SUCCESS_HOOKS.get(job.kind)
    if hook is not None:
        import_string(hook)(job)


def cancel(job: Job, actor=None) -> Job:
    """Cancel a job: a queued one at once, a running one within a second (its runner
    polls ``cancel_requested``). A finished job is left as it is. The first person to ask
    is kept on the job and in the model's audit trail."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        queued = job.status == JobStatus.QUEUED
        who = {} if job.cancel_requested else {"cancelled_by": actor if actor is not None and actor.is_authenticated else None}
        if queued:
            _set(job, status=JobStatus.CANCELLED, cancel_requested=True, finished_at=timezone.now(), error="cancelled before it started", **who)
        elif job.status == JobStatus.RUNNING:
            _set(job, cancel_requested=True, **who)
        if who and job.cancel_requested:
            events.job_cancelled(job, actor)
    relay(job)
    if queued:
        _ended_without_success(job)
    return job


def sweep_stale() -> int:
    """Jobs whose runner went silent (its Celery worker was killed) are queued again, or
    failed once they have used ``JOB_MAX_ATTEMPTS``; queued jobs whose send failed are
    sent again, and so are jobs whose message was lost (``_lost``). A silent job someone
    cancelled ends cancelled. Returns how many jobs it touched."""
    now = timezone.now()
    stale_before = database_time_ago(settings.JOB_STALE_AFTER_S)
    touched = 0
    for job in Job.objects.filter(status=JobStatus.RUNNING, heartbeat_at__lt=stale_before):
        touched += _recover(job, now, stale_before)
    unsent = Job.objects.filter(status=JobStatus.QUEUED, heartbeat_at__isnull=True, created_at__lt=database_time_ago(UNSENT_GRACE_S))
    for job_id in [*unsent.values_list("pk", flat=True), *_lost(stale_before)]:
        _send(job_id)
        touched += 1
    return touched


def database_time_ago(seconds: float) -> ExpressionWrapper:
    """The database's clock ``seconds`` ago, for comparing with heartbeats, which are the
    database's time too: runners and beat run on hosts whose clocks may differ, and a jobs
    host 45 s behind had a live job taken for lost (and run twice), a beat host ahead the same."""
    return ExpressionWrapper(Now() - timedelta(seconds=seconds), output_field=DateTimeField())


def _lost(sent_before) -> list[int]:
    """Queued jobs sent long ago while no job runs anywhere: an idle jobs worker would have
    taken them, so their message is gone (a Redis restarted without persistence, a purged
    queue). Sent again at most once per ``JOB_STALE_AFTER_S``; a duplicate is harmless
    (``claim``). While any job runs, a long queue is just waiting, and nothing is resent."""
    if Job.objects.filter(status=JobStatus.RUNNING).exists():
        return []
    return list(Job.objects.filter(status=JobStatus.QUEUED, heartbeat_at__lt=sent_before).values_list("pk", flat=True))


def _recover(job: Job, now, stale_before) -> int:
    # Still silent when written: a runner that claimed it since the listing is alive.
    stale = held(job).filter(heartbeat_at__lt=stale_before)
    # Someone cancelled it (read as it is written: a cancel may land after the listing):
    # neither run again nor the worker's failure.
    changed = stale.filter(cancel_requested=True).update(status=JobStatus.CANCELLED, finished_at=now,
                                                         error="cancelled (its runner had stopped, so it ended here)")
    if not changed:
        changed = _queue_again_or_fail(job, stale.filter(cancel_requested=False), now)
    if changed:
        job.refresh_from_db()
        logger.warning("job %s: %s", job.pk, job.error)
        relay(job)
        if job.status == JobStatus.QUEUED:
            _send(job.pk)
        else:
            _ended_without_success(job)
    return changed


def _queue_again_or_fail(job: Job, stale, now) -> int:
    silent_s = settings.JOB_STALE_AFTER_S
    if job.attempts >= settings.JOB_MAX_ATTEMPTS:
        reason = (f"its Celery worker stopped while it ran (no heartbeat for {silent_s:g} s), "
                  f"after {job.attempts} attempt{'s' if job.attempts != 1 else ''}")
        return stale.update(status=JobStatus.FAILED, finished_at=now, error=reason)
    return stale.update(status=JobStatus.QUEUED, heartbeat_at=None,
                        error=f"attempt {job.attempts} stopped (no heartbeat for {silent_s:g} s); queued again")


def payload(job: Job) -> dict:
    """What the API and the live feed show of a job."""
    return {
        "id": job.pk,
        "kind": job.kind,
        "model": job.model.name,
        "version": job.version.number if job.version_id else None,
        "dataset": job.dataset.name if job.dataset_id else None,
        "status": job.status,
        "done": job.done,
        "total": job.total,
        "rate_per_s": job.rate_per_s,
        "eta_s": job.eta_s,
        "error": job.error,
        "result": job.result,
        "params": job.params,
        "input_format": job.input_format,
        "input_name": job.input_name,
        "output_format": job.output_format,
        "output_bytes": job.output_bytes,
        "output_available": output_available(job),
        "attempts": job.attempts,
        "cancel_requested": job.cancel_requested,
        "created_by": job.created_by.get_username() if job.created_by_id else None,
        "cancelled_by": job.cancelled_by.get_username() if job.cancelled_by_id else None,
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
    }


def output_available(job: Job) -> bool:
    return job.status == JobStatus.SUCCEEDED and bool(job.output_format) and job.output_removed_at is None


def is_finished(job: Job) -> bool:
    return job.status in TERMINAL_JOB_STATUSES


def _iso(moment) -> str | None:
    return None if moment is None else moment.isoformat()


def relay(job: Job) -> None:
    try:
        send_to_group(LIVE_GROUP, {"type": "live.job", "job": payload(job)})
    except Exception:
        logger.debug("live relay of job %s failed", job.pk, exc_info=True)
