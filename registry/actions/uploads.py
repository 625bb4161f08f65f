"""Registering model versions: a version is registered whole or not at all.

Bytes are staged and hashed (``storage``), inspected in a child process
(``inspection``), moved into the content-addressed store, and only then recorded.
A refused upload leaves no file and no row, only an audit event saying why.
A version whose inputs differ from the stable version's is still registered, but its
report says it is incompatible (``validation_report["compatibility"]``).
At most ``INSPECTION_MAX_CONCURRENT`` inspections run at once across every console
process; beyond that an upload is a 503 with ``Retry-After``, and leaves nothing.
"""

from __future__ import annotations

from typing import BinaryIO

from django.conf import settings
from django.db import transaction
from django.db.models import Max

from registry.actions import events, releases
from registry.artifacts import storage
from registry.artifacts.inspection import (
    InspectionError,
    inspect_artifact,
    inspection_slot,
)
from registry.domain.choices import VersionStatus
from registry.domain.compatibility import compatibility_report
from registry.models import ModelVersion, RegisteredModel


class UploadRefused(Exception):
    """An upload that is not registered; ``status`` is the HTTP answer."""

    def __init__(self, reason: str, status: int = 422, retry_after_s: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after_s = retry_after_s


def register_stream(model: RegisteredModel, source: BinaryIO, *, uploaded_by, description: str = "", metrics: dict | None = None) -> ModelVersion:
    """Stage bytes from any file-like object, then register them."""
    try:
        staged = storage.stage_stream(source)
    except storage.UploadTooLarge as error:
        raise UploadRefused(str(error), status=413) from None
    return register_staged(model, staged, uploaded_by=uploaded_by, description=description, metrics=metrics)


def register_staged(model: RegisteredModel, staged: storage.StagedArtifact, *, uploaded_by, description: str = "", metrics: dict | None = None) -> ModelVersion:
    try:
        report = _inspect(model, staged, uploaded_by)
        created_file = storage.commit(staged)
    finally:
        storage.discard(staged)
    try:
        version = _insert_next(model, staged, report, uploaded_by, description, metrics or {})
    except BaseException:
        if created_file:
            _forget_unreferenced(staged.sha256)
        raise
    releases.route_first_version(version, uploaded_by)
    return version


def _inspect(model: RegisteredModel, staged: storage.StagedArtifact, uploaded_by):
    if staged.size_bytes == 0:
        _refuse(model, uploaded_by, "the artifact is empty", 400, staged.sha256)
    try:
        with inspection_slot(settings.DATA_DIR / "inspection-slots", settings.INSPECTION_MAX_CONCURRENT):
            return inspect_artifact(
                staged.path,
                timeout_s=settings.INSPECTION_TIMEOUT_S,
                memory_limit_bytes=settings.INSPECTION_MEMORY_LIMIT_BYTES,
                cpu_limit_s=settings.INSPECTION_CPU_LIMIT_S,
                # The worker warms every size up to this before routing the version.
                max_batch_size=model.max_batch_size or settings.SERVING_DEFAULT_MAX_BATCH_SIZE,
            )
    except InspectionError as error:
        if error.retry_after_s is not None:  # busy, not a verdict on the model: no audit event
            raise UploadRefused(error.reason, error.status, error.retry_after_s) from None
        _refuse(model, uploaded_by, error.reason, error.status, staged.sha256)


def _refuse(model, uploaded_by, reason: str, status: int, sha256: str):
    events.upload_refused(model, uploaded_by, reason, sha256)
    raise UploadRefused(reason, status)


@transaction.atomic
def _insert_next(model, staged, report, uploaded_by, description: str, metrics: dict) -> ModelVersion:
    # The model's row lock (PostgreSQL) or the write lock taken at BEGIN (SQLite in
    # IMMEDIATE mode) makes concurrent uploads take numbers one after the other.
    locked = RegisteredModel.objects.select_for_update().get(pk=model.pk)
    number = (locked.versions.aggregate(top=Max("number"))["top"] or 0) + 1
    # Compared inside the insert's transaction: the row is never stored without it.
    validation_report = {**report.report, "compatibility": _compatibility_with_stable(locked, report.signature)}
    version = ModelVersion.objects.create(
        model=locked,
        number=number,
        sha256=staged.sha256,
        size_bytes=staged.size_bytes,
        status=VersionStatus.READY,
        signature=report.signature,
        opset=report.opset,
        producer=report.producer,
        validation_report=validation_report,
        description=description,
        metrics=metrics,
        uploaded_by=uploaded_by if uploaded_by is not None and uploaded_by.is_authenticated else None,
    )
    events.version_uploaded(version, uploaded_by)
    return version


def _compatibility_with_stable(model: RegisteredModel, signature: dict) -> dict:
    release = model.current_release()
    stable = None if release is None else model.versions.filter(number=release.stable_version).first()
    if stable is None:
        return compatibility_report(None, None, signature)
    return compatibility_report(stable.number, stable.signature, signature)


def _forget_unreferenced(sha256: str) -> None:
    if not ModelVersion.objects.with_artifact().filter(sha256=sha256).exists():
        storage.delete(sha256)
