"""Retention: delete old artifacts so the store does not grow forever.

NEVER delete the artifact of a version that
- is among the newest ``RETENTION_KEEP_VERSIONS`` versions of its model,
- is routed now (any weight, shadows included) or kept warm,
- or could be reached by up to ``RETENTION_ROLLBACK_DEPTH`` rollbacks from the
  current release (one rollback always, whatever the setting).
Rows are never deleted: an archived version keeps its metadata, report and metrics.
A file shared by several versions (same bytes) is deleted only when none of them
still needs it. Models are handled one at a time, each in its own transaction.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry import events, storage
from registry.choices import VersionStatus
from registry.models import ModelVersion, RegisteredModel, Release, ServingGeneration

logger = logging.getLogger(__name__)
STALE_UPLOAD_S = 24 * 3600


def protected_versions(model: RegisteredModel, keep: int) -> set[int]:
    """Numbers of the versions of ``model`` whose artifacts must stay."""
    newest = model.versions.order_by("-number").values_list("number", flat=True)[:keep]
    depth = max(settings.RETENTION_ROLLBACK_DEPTH, 1)
    return set(newest) | rollback_reachable(model.current_release(), depth)


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
    _delete_unreferenced_files([version.sha256 for version in archived])
    _delete_stale_uploads()
    return archived


def _apply_to_model(model_pk: int, keep: int) -> list[ModelVersion]:
    with transaction.atomic():
        # The generation lock stops a traffic change from routing a version while we
        # decide it is unrouted.
        ServingGeneration.objects.lock()
        model = RegisteredModel.objects.get(pk=model_pk)
        protected = protected_versions(model, keep)
        doomed = model.versions.with_artifact().exclude(number__in=protected).order_by("pk")
        archived = [_archive(version) for version in doomed]
    return archived


def _archive(version: ModelVersion) -> ModelVersion:
    version.status = VersionStatus.ARCHIVED
    version.archived_at = timezone.now()
    version.save(update_fields=["status", "archived_at"])
    events.version_archived(version)
    logger.info("archived %s", version)
    return version


def _delete_unreferenced_files(sha256s: list[str]) -> None:
    for sha256 in set(sha256s):
        if not ModelVersion.objects.with_artifact().filter(sha256=sha256).exists():
            storage.delete(sha256)


def _delete_stale_uploads() -> None:
    """Staged files left by a crashed upload; a live upload is never a day old."""
    cutoff = time.time() - STALE_UPLOAD_S
    for path in storage.tmp_dir().glob("*.part"):
        if path.stat().st_mtime < cutoff:
            path.unlink(missing_ok=True)
