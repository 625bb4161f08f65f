"""Retention: delete old artifacts so the store does not grow forever.

NEVER delete the artifact of a version that
- is among the newest ``RETENTION_KEEP_VERSIONS`` versions of its model,
- is routed now (any weight, shadows included) or kept warm,
- or could be reached by up to ``RETENTION_ROLLBACK_DEPTH`` rollbacks from the
  current release (one rollback always, whatever the setting); for an archived model
  that counts from the release served before the archive, which a restore brings back,
- or is still being validated (its validation job reads the stored bytes),
- or is the version of a queued or running batch job,
- or is routed by the release a running drill rolls forward to (or one whose roll forward
  is still owed), or is either side of an active rollout (running or paused).
Rows are never deleted: an archived version keeps its metadata, report and metrics.
A file shared by several versions (same bytes) is deleted only when none of them
still needs it. Models are handled one at a time, each in its own transaction, and a
model's files are deleted as soon as its transaction commits. A run that an outage stops
midway (registry/task_outage.py skips it) may leave the file of a version it archived:
every run deletes such leftovers too, so the next run does the work.

Stored files that no version records (an upload killed between storing its bytes and
recording its version, a rejection killed before it deleted the file) go too, once they
have not been stored for ``STALE_UPLOAD_S``. NEVER delete one that a validating, ready
or archived version names (archived ones are judged above), or one stored within that
time: its upload may not have committed its row yet (``storage.commit`` refreshes a file
it stores again, and ``storage.delete_stale`` checks both again with the file moved aside).

Fleet rows (``forget_gone_workers``) are pruned too; what must stay is said there.
So are the files of old jobs (``job_retention``), with their own rules.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q, QuerySet
from django.utils import timezone

from registry.actions import events, job_retention, uploads
from registry.artifacts import storage
from registry.domain.choices import ACTIVE_ROLLOUT_STATUSES, TERMINAL_JOB_STATUSES, DrillStatus, JobKind, VersionStatus
from registry.fleet.state import current_generation
from registry.models import (
    Drill,
    Job,
    ModelVersion,
    RegisteredModel,
    Release,
    ServingGeneration,
    Worker,
    WorkerAck,
)

logger = logging.getLogger(__name__)
STALE_UPLOAD_S = 24 * 3600
DELETE_CHUNK = 1000


def protected_versions(model: RegisteredModel, keep: int) -> set[int]:
    """Numbers of the versions of ``model`` whose artifacts must stay."""
    # A rejected version never had a usable artifact: it takes none of the kept places.
    newest = model.versions.exclude(status=VersionStatus.REJECTED).order_by("-number").values_list("number", flat=True)[:keep]
    depth = max(settings.RETENTION_ROLLBACK_DEPTH, 1)
    current = model.current_release()
    if current is not None and current.is_archive:
        current = current.rollback_target  # routes nothing itself: what a restore serves again is what counts
    return set(newest) | rollback_reachable(current, depth) | versions_jobs_await(model) | versions_owed(model)


def versions_owed(model: RegisteredModel) -> set[int]:
    """Versions something in progress will route again: the release a running drill (or
    one whose roll forward is still owed) restores, and both sides of an active rollout
    (a paused one is resumed to its step). Archived meanwhile (an hourly run while a drill
    waited on a stopped worker), the roll forward failed for good and the resume was a 400."""
    owed: set[int] = set()
    drills = model.drills.filter(Q(status=DrillStatus.RUNNING) | Q(forward_pending=True), roll_forward=True, from_generation__isnull=False)
    for release in Release.objects.filter(model=model, generation__in=drills.values("from_generation")):
        owed.update(release.routed_versions())
    for canary, stable in model.rollouts.filter(status__in=ACTIVE_ROLLOUT_STATUSES).values_list("canary_version", "stable_version"):
        owed.update((canary, stable))
    return owed


def versions_jobs_await(model: RegisteredModel) -> set[int]:
    """Versions a queued or running batch job of ``model`` will run: archived under one, a
    version failed it when its worker came ("deleted by retention"), the input someone sent
    thrown away. The benchmark and evaluations every ready version gets by itself are no
    reason to keep an old one: with the jobs worker down they would keep every version."""
    unfinished = Job.objects.filter(model=model, kind=JobKind.BATCH, version__isnull=False).exclude(status__in=TERMINAL_JOB_STATUSES)
    return set(unfinished.values_list("version__number", flat=True))


def rollback_reachable(release: Release | None, depth: int) -> set[int]:
    """Versions routed by ``release`` or by a release up to ``depth`` rollbacks away."""
    numbers: set[int] = set()
    for _ in range(depth + 1):
        if release is None:
            break
        numbers.update(release.routed_versions())
        release = release.rollback_target
    return numbers


def apply_retention(keep: int | None = None) -> list[ModelVersion]:
    """Archive what may go, in every model; returns the versions archived."""
    keep = keep or settings.RETENTION_KEEP_VERSIONS
    archived: list[ModelVersion] = []
    for model_pk in RegisteredModel.objects.order_by("pk").values_list("pk", flat=True):
        archived.extend(_apply_to_model(model_pk, keep))
    _delete_stale_uploads()
    delete_unrecorded_files()
    forget_gone_workers()
    job_retention.remove_old_job_files()
    job_retention.delete_unrecorded_job_files()
    return archived


def _apply_to_model(model_pk: int, keep: int) -> list[ModelVersion]:
    """Archive what may go in one model, then delete the files it no longer needs: those
    of the versions archived now, and those an earlier run archived but, stopped by an
    outage, did not delete (the archived rows are committed, so no later query finds
    them among the versions to archive)."""
    started_s = time.time()
    with transaction.atomic():
        # The generation lock stops a traffic change from routing a version while we
        # decide it is unrouted.
        ServingGeneration.objects.lock()
        model = RegisteredModel.objects.get(pk=model_pk)
        protected = protected_versions(model, keep)
        # Only ready versions: one still being validated is about to be judged, not archived.
        doomed = model.versions.ready().exclude(number__in=protected).order_by("pk")
        archived = [_archive(version) for version in doomed]
        # An archived version that a rollback could reach again keeps its file all the same.
        leftovers = {sha256 for sha256, archived_at in model.versions.filter(status=VersionStatus.ARCHIVED)
                     .exclude(number__in=protected).values_list("sha256", "archived_at") if _left_behind(sha256, archived_at)}
    # Committed: these versions are archived whatever happens next. Deleted now, not after
    # every model: an outage later in the run must not leave their files behind.
    _delete_unreferenced_files([*(version.sha256 for version in archived), *leftovers], started_s)
    return archived


def _left_behind(sha256: str, archived_at) -> bool:
    """The file is the one its version had when archived, still there: not bytes an upload
    stored again since (its file is newer than the archive, and its row may not have
    committed yet, so no query would protect it)."""
    try:
        modified_s = storage.path_for(sha256).stat().st_mtime
    except FileNotFoundError:
        return False
    return archived_at is not None and modified_s < archived_at.timestamp()


def _archive(version: ModelVersion) -> ModelVersion:
    version.status = VersionStatus.ARCHIVED
    version.archived_at = timezone.now()
    version.save(update_fields=["status", "archived_at"])
    events.version_archived(version)
    logger.info("archived %s", version)
    return version


def _delete_unreferenced_files(sha256s: list[str], since_s: float) -> None:
    """Delete each file no version still needs: the store is content-addressed, so a file
    archived in one version may be the artifact of a ready or validating one (any model),
    or of an upload that stored the same bytes after ``since_s`` and whose row has not
    committed yet (``storage.delete_stale`` checks both with the file moved aside)."""
    for sha256 in set(sha256s):
        storage.delete_stale(sha256, since_s, partial(uploads.needs_artifact, sha256))


def delete_unrecorded_files() -> int:
    """Delete the stored files no version records, last stored ``STALE_UPLOAD_S`` ago or
    more; returns how many went."""
    cutoff_s = time.time() - STALE_UPLOAD_S
    deleted = 0
    for sha256s in storage.stored_before(cutoff_s):  # one folder of the store at a time
        recorded = set(_recording_versions().filter(sha256__in=sha256s).values_list("sha256", flat=True))
        for sha256 in recorded:
            storage.put_back(sha256)  # if a sweep killed midway left it aside
        deleted += sum(_delete_unrecorded(sha256, cutoff_s) for sha256 in sha256s if sha256 not in recorded)
    return deleted


def _delete_unrecorded(sha256: str, cutoff_s: float) -> bool:
    # Asked again with the file moved aside: a row may have committed since the listing.
    if not storage.delete_stale(sha256, cutoff_s, partial(_is_recorded, sha256)):
        return False
    logger.warning("deleted the stored file %s: no version records it (an upload or a rejection cut off midway)", sha256)
    return True


def _recording_versions() -> QuerySet:
    # An archived version's file is _apply_to_model's to judge (it keeps some); a rejected
    # version never keeps its file.
    return ModelVersion.objects.exclude(status=VersionStatus.REJECTED)


def _is_recorded(sha256: str) -> bool:
    return _recording_versions().filter(sha256=sha256).exists()


def _delete_stale_uploads() -> None:
    """Staged files left by a crashed upload; a live upload is never a day old."""
    cutoff = time.time() - STALE_UPLOAD_S
    for path in storage.tmp_dir().glob("*.part"):
        if path.stat().st_mtime < cutoff:
            path.unlink(missing_ok=True)


def forget_gone_workers() -> tuple[int, int]:
    """Delete the fleet rows nobody needs any more; returns (workers, acks) deleted.

    NEVER delete
    - a worker seen within ``WORKER_FORGET_AFTER_S`` (never less than
      ``WORKER_GONE_AFTER_S``, so a live worker is never forgotten),
    - an ack of the current generation, or of any generation a running drill waits for
      (its ``from_generation`` or later),
    - the newest ack of each worker still known.
    A forgotten worker that comes back reports again before its next ack is accepted.
    """
    cutoff = timezone.now() - timedelta(seconds=worker_forget_after_s())
    workers = _delete_in_chunks(Worker.objects.filter(last_seen_at__lt=cutoff))
    known = Worker.objects.values("worker_id")
    newest = WorkerAck.objects.filter(worker_id__in=known).values("worker_id").annotate(newest=Max("pk")).values("newest")
    doomed = (
        WorkerAck.objects.filter(generation__lt=_oldest_needed_generation())
        .filter(Q(received_at__lt=cutoff) | ~Q(worker_id__in=known))
        .exclude(pk__in=newest)
    )
    acks = _delete_in_chunks(doomed)
    if workers or acks:
        logger.info("forgot %s worker(s) unseen since %s and deleted %s old ack(s)", workers, cutoff.isoformat(), acks)
    return workers, acks


def forget_worker(worker_id: str) -> bool:
    """Forget one worker now, and its acks: its id is free for the next worker that
    reports under it, with a key of its own (registry/fleet/worker_keys.py). What an
    operator does for a worker whose id is fixed and whose key was lost with its cache
    directory. False when no worker has that id."""
    with transaction.atomic():
        deleted, _ = Worker.objects.filter(worker_id=worker_id).delete()
        if deleted:
            WorkerAck.objects.filter(worker_id=worker_id).delete()
    if deleted:
        logger.info("forgot worker %s and its acks", worker_id)
    return bool(deleted)


def worker_forget_after_s() -> float:
    return max(settings.WORKER_FORGET_AFTER_S, settings.WORKER_GONE_AFTER_S)


def _oldest_needed_generation() -> int:
    """Acks at or after this generation may still be read: the current one, and those
    a running drill waits for."""
    running = Drill.objects.filter(status=DrillStatus.RUNNING).values_list("from_generation", flat=True)
    return min([current_generation(), *(generation or 0 for generation in running)])


def _delete_in_chunks(queryset: QuerySet) -> int:
    """Delete what ``queryset`` selects, a bounded number of rows per statement.

    Each DELETE repeats the query's own conditions beside the listed ids: a row that
    stopped matching after it was listed (a gone worker that reported again) stays."""
    deleted = 0
    while ids := list(queryset.values_list("pk", flat=True)[:DELETE_CHUNK]):
        removed = queryset.filter(pk__in=ids).delete()[0]
        deleted += removed
        if not removed:  # all changed since listed; never spin on a listing the DELETE disagrees with
            break
    return deleted
