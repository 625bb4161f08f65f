"""Registering model versions.

An upload over HTTP (``accept_staged``) is answered at once: what is cheap to refuse
(empty, not a protobuf ModelProto at all: ``artifacts.sniff``) is refused with no file
and no row, only an audit event saying why; anything else is moved into the
content-addressed store and recorded as a version in ``validating``, its number taken
now, and a ``validation`` job (``registry.jobs.validation``) inspects it after the
answer. The inspection's verdict makes the version ``ready`` (``mark_ready``) or
``rejected`` (``mark_rejected``: it keeps its number and report, loses its artifact).
Nothing routes, serves or downloads a version that is not ready.

``register_stream`` / ``register_staged`` (the demo models, fixtures, tests) inspect
inline and register a ready version whole, or nothing.

Bytes are staged and hashed (``storage``), inspected in a child process
(``inspection``), then recorded. A version whose inputs differ from the stable
version's is still registered, but its report says it is incompatible
(``validation_report["compatibility"]``). At most ``INSPECTION_MAX_CONCURRENT``
inspections run at once across every process; beyond that an inline registration is a
503 with ``Retry-After`` (a validation job waits for a slot instead).
"""

from __future__ import annotations

import errno
import time
from datetime import timedelta
from functools import partial
from typing import BinaryIO

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from registry.actions import events, releases
from registry.artifacts import sniff, storage
from registry.artifacts.inspection import (
    InspectionError,
    InspectionReport,
    inspect_artifact,
    inspection_slot,
)
from registry.domain.choices import AuditKind, JobKind, VersionStatus
from registry.domain.compatibility import compatibility_report
from registry.jobs import records, scheduling
from registry.models import AuditEvent, Job, ModelVersion, RegisteredModel, ServingGeneration


class UploadRefused(Exception):
    """An upload that is not registered; ``status`` is the HTTP answer."""

    def __init__(self, reason: str, status: int = 422, retry_after_s: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after_s = retry_after_s


class DuplicateUpload(UploadRefused):
    """The bytes are those of an existing version of the same model; nothing was stored."""

    def __init__(self, existing: ModelVersion):
        # What happened; the message adds how an API client asks for a copy (the console's
        # upload form names its own checkbox instead).
        self.identical = (f"the file is identical to version {existing.number} of {existing.model.name} "
                          f"({existing.get_status_display().lower()}, sha256 {existing.sha256[:12]}): nothing was stored")
        super().__init__(f"{self.identical}; send allow_duplicate=true to register it as a new version anyway", status=409)
        self.existing = existing


# ---------------------------------------------------------------- answered at once, validated by a job


def accept_staged(model: RegisteredModel, staged: storage.StagedArtifact, *, uploaded_by, description: str = "",
                  allow_duplicate: bool = False) -> tuple[ModelVersion, Job]:
    """Refuse at once what is cheap to refuse (UploadRefused; DuplicateUpload for the
    bytes of an existing version unless ``allow_duplicate``); else store the bytes and
    record a ``validating`` version with its validation job, queued after commit."""
    try:
        reason = sniff.not_onnx_reason(staged.path)
        if reason is not None:
            _refuse(model, uploaded_by, reason, 400, staged.sha256)
        _check_open(model, staged.sha256, allow_duplicate)  # before storing; again under the lock below
        # Bytes first, then the row: a process killed between leaves a file no row names,
        # which retention deletes a day later (delete_unrecorded_files); never a version
        # whose bytes are missing, which workers would fetch and jobs would run.
        stored_at = time.time()
        created_file = storage.commit(staged)
    finally:
        storage.discard(staged)
    try:
        with transaction.atomic():
            version = _insert_next(model, staged, uploaded_by, description=description, metrics={}, allow_duplicate=allow_duplicate)
            job = records.create(JobKind.VALIDATION, version.model, version=version, key=validation_key(version), created_by=uploaded_by)
    except BaseException:
        if created_file:
            _forget_unreferenced(staged.sha256, stored_at)
        raise
    return version, job


def validation_key(version: ModelVersion) -> str:
    return f"validation:{version.pk}"


def inspect_stored(version: ModelVersion, should_stop=None) -> InspectionReport:
    """Inspect a stored version's bytes (the caller holds an inspection slot); raises
    ``InspectionStopped`` when ``should_stop()`` says so while the child runs."""
    return _inspect_path(version.model, storage.path_for(version.sha256), version.sha256, should_stop)


def mark_ready(version: ModelVersion, report: InspectionReport) -> bool:
    """The inspection passed: the version becomes ready (once; False if it was not
    validating any more), the first ready version is routed, its jobs are queued, all in
    one transaction. Ready committed first, a job cut off before the rest (killed, or the
    generation lock past its timeout) left the version ready, unrouted and never measured,
    and its rerun found nothing left to judge."""
    with transaction.atomic():
        ServingGeneration.objects.lock()  # first: the order releases and the catalogue lock in
        locked = _lock_validating(version)
        if locked is None:
            return False
        fields = {"status": VersionStatus.READY, "status_reason": "", **_ready_fields(locked.model, report)}
        for name, value in fields.items():
            setattr(locked, name, value)
        locked.save(update_fields=list(fields))
        events.version_uploaded(locked, locked.uploaded_by)
        _after_ready(locked, locked.uploaded_by)
    return True


def mark_rejected(version: ModelVersion, reason: str, report: dict | None = None, *, actor=None) -> bool:
    """The version is refused: it keeps its number and the checks run so far, loses its
    artifact (unless another version needs the same bytes). Once; False if it was not
    validating any more. ``actor``: the person who refused it (a cancelled validation),
    else the verdict is the uploader's."""
    since = time.time()
    with transaction.atomic():
        locked = _lock_validating(version)
        if locked is None:
            return False
        locked.status = VersionStatus.REJECTED
        locked.status_reason = reason
        locked.validation_report = {**(report or {}), "refused": reason}
        locked.save(update_fields=["status", "status_reason", "validation_report"])
        events.version_rejected(locked, reason, actor=actor)
    _forget_unreferenced(locked.sha256, since)  # after the row says rejected: no version needs the bytes now
    return True


def _lock_validating(version: ModelVersion) -> ModelVersion | None:
    # Model row first, then the version: the order _insert_next and releases lock in.
    RegisteredModel.objects.select_for_update().filter(pk=version.model_id).first()
    # No select_related: PostgreSQL cannot lock the nullable side of an outer join (uploaded_by).
    locked = ModelVersion.objects.select_for_update().filter(pk=version.pk).first()
    if locked is None or locked.status != VersionStatus.VALIDATING:
        return None
    return locked


# ---------------------------------------------------------------- inline: registered whole or not at all


def register_stream(model: RegisteredModel, source: BinaryIO, *, uploaded_by, description: str = "", metrics: dict | None = None) -> ModelVersion:
    """Stage bytes from any file-like object, then register them."""
    try:
        staged = storage.stage_stream(source)
    except storage.UploadTooLarge as error:
        raise UploadRefused(str(error), status=413) from None
    return register_staged(model, staged, uploaded_by=uploaded_by, description=description, metrics=metrics)


def register_staged(model: RegisteredModel, staged: storage.StagedArtifact, *, uploaded_by, description: str = "", metrics: dict | None = None) -> ModelVersion:
    """Inspect now (holding the request), and register a ready version or nothing."""
    try:
        report = _inspect(model, staged, uploaded_by)
        stored_at = time.time()
        created_file = storage.commit(staged)
    finally:
        storage.discard(staged)
    try:
        with transaction.atomic():  # ready together with its route and jobs, as mark_ready
            ServingGeneration.objects.lock()
            version = _insert_next(model, staged, uploaded_by, report=report, description=description, metrics=metrics or {})
            _after_ready(version, uploaded_by)
    except BaseException:
        if created_file:
            _forget_unreferenced(staged.sha256, stored_at)
        raise
    return version


def _after_ready(version: ModelVersion, actor) -> None:
    releases.route_first_version(version, actor)
    scheduling.version_ready(version)


def _inspect(model: RegisteredModel, staged: storage.StagedArtifact, uploaded_by) -> InspectionReport:
    if staged.size_bytes == 0:
        _refuse(model, uploaded_by, "the artifact is empty", 400, staged.sha256)
    try:
        with inspection_slot(settings.DATA_DIR / "inspection-slots", settings.INSPECTION_MAX_CONCURRENT):
            return _inspect_path(model, staged.path, staged.sha256)
    except InspectionError as error:
        if error.retry_after_s is not None:  # busy, not a verdict on the model: no audit event
            raise UploadRefused(error.reason, error.status, error.retry_after_s) from None
        _refuse(model, uploaded_by, error.reason, error.status, staged.sha256)


def _inspect_path(model: RegisteredModel, path, sha256: str, should_stop=None) -> InspectionReport:
    """Inspect the bytes at ``path`` if they are still the ones hashed to ``sha256`` when
    they arrived: a file rewritten, or a link put in its place, meanwhile is no upload."""
    try:
        opened = storage.open_unfollowed(path)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise InspectionError("the stored upload is a symbolic link, not the file uploaded: no inspection follows one; "
                              "nothing was run on it", status=500) from None
    with opened:
        return inspect_artifact(
            opened,
            sha256=sha256,
            should_stop=should_stop,
            timeout_s=settings.INSPECTION_TIMEOUT_S,
            memory_limit_bytes=settings.INSPECTION_MEMORY_LIMIT_BYTES,
            cpu_limit_s=settings.INSPECTION_CPU_LIMIT_S,
            # The worker warms every size up to this before routing the version.
            max_batch_size=model.max_batch_size or settings.SERVING_DEFAULT_MAX_BATCH_SIZE,
        )


def refuse_too_large(model: RegisteredModel, uploaded_by) -> UploadRefused:
    """The 413 of an operator's upload over MAX_UPLOAD_BYTES, recorded like the other cheap
    refusals (it was not: the audit showed only the 400s)."""
    reason = str(storage.UploadTooLarge(settings.MAX_UPLOAD_BYTES))
    if not _refused_lately(model, uploaded_by, reason):
        events.upload_refused(model, uploaded_by, reason)
    return UploadRefused(reason, 413)


TOO_LARGE_RECORDED_EVERY = timedelta(minutes=1)


def _refused_lately(model: RegisteredModel, uploaded_by, reason: str) -> bool:
    """The same refusal of the same person recorded in the last minute: a 413 costs a
    client no body, and a loop of them wrote 175 audit rows a second (an attacker's token)."""
    since = timezone.now() - TOO_LARGE_RECORDED_EVERY
    return AuditEvent.objects.filter(model=model, kind=AuditKind.UPLOAD_REFUSED, actor=uploaded_by, message=f"Upload refused: {reason}",
                                     created_at__gte=since).exists()


def record_too_large(model_name: str, uploaded_by) -> None:
    """``refuse_too_large``'s record, for a refusal made before the request reached a view
    (console/body_limit.py); a model that does not exist records nothing."""
    model = RegisteredModel.objects.filter(name=model_name).first()
    if model is not None:
        refuse_too_large(model, uploaded_by)


def _refuse(model, uploaded_by, reason: str, status: int, sha256: str):
    events.upload_refused(model, uploaded_by, reason, sha256)
    raise UploadRefused(reason, status)


def _check_open(model: RegisteredModel, sha256: str, allow_duplicate: bool) -> None:
    """An upload over HTTP goes to a model that is not archived, and brings new bytes
    unless it says it means a copy (what the inline registrations never check)."""
    if model.is_archived:
        raise UploadRefused(f"{model.name} is archived: restore it from the archive before uploading versions", 409)
    existing = None if allow_duplicate else model.versions.filter(sha256=sha256).order_by("number").first()
    if existing is not None:
        raise DuplicateUpload(existing)


@transaction.atomic
def _insert_next(model, staged, uploaded_by, *, report: InspectionReport | None = None, description: str, metrics: dict,
                 allow_duplicate: bool | None = None) -> ModelVersion:
    """The model's next version: ``ready`` with the report of an inline inspection,
    else ``validating``. ``allow_duplicate`` False or True: an HTTP upload, checked
    again under the lock (two identical uploads at once make one version)."""
    # The model's row lock (PostgreSQL) or the write lock taken at BEGIN (SQLite in
    # IMMEDIATE mode) makes concurrent uploads take numbers one after the other.
    locked = RegisteredModel.objects.select_for_update().get(pk=model.pk)
    if allow_duplicate is not None:
        _check_open(locked, staged.sha256, allow_duplicate)
    number = (locked.versions.aggregate(top=Max("number"))["top"] or 0) + 1
    verdict = {} if report is None else _ready_fields(locked, report)
    version = ModelVersion.objects.create(
        model=locked,
        number=number,
        sha256=staged.sha256,
        size_bytes=staged.size_bytes,
        status=VersionStatus.READY if report is not None else VersionStatus.VALIDATING,
        description=description,
        metrics=metrics,
        uploaded_by=uploaded_by if uploaded_by is not None and uploaded_by.is_authenticated else None,
        **verdict,
    )
    if report is not None:
        events.version_uploaded(version, uploaded_by)
    return version


def _ready_fields(model: RegisteredModel, report: InspectionReport) -> dict:
    # Compared inside the transaction that stores the verdict: never stored without it.
    return {
        "signature": report.signature,
        "opset": report.opset,
        "producer": report.producer,
        "validation_report": {**report.report, "compatibility": _compatibility_with_stable(model, report.signature)},
    }


def _compatibility_with_stable(model: RegisteredModel, signature: dict) -> dict:
    release = model.current_release()
    stable = None if release is None else model.versions.filter(number=release.stable_version).first()
    if stable is None:
        return compatibility_report(None, None, signature)
    return compatibility_report(stable.number, stable.signature, signature)


def _forget_unreferenced(sha256: str, since_s: float) -> None:
    """Delete the stored file unless a version needs it or an upload stored these bytes
    again after ``since_s`` (a time.time()): that upload's row may not have committed yet,
    and no query would see it (``storage.delete_stale`` checks both with the file aside)."""
    storage.delete_stale(sha256, since_s, partial(needs_artifact, sha256))


def needs_artifact(sha256: str) -> bool:
    """Whether a version that keeps its artifact has these bytes."""
    return ModelVersion.objects.with_artifact().filter(sha256=sha256).exists()
