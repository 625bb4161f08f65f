"""Audit events: one tiny function per kind, so the timeline reads the same everywhere."""

from __future__ import annotations

from registry.domain.choices import AuditKind
from registry.models import (
    AuditEvent,
    Drill,
    EvaluationDataset,
    Job,
    ModelVersion,
    RegisteredModel,
    Release,
    Rollout,
)


def _actor(user):
    return user if user is not None and user.is_authenticated else None


def model_created(model: RegisteredModel, user) -> AuditEvent:
    return AuditEvent.objects.create(model=model, kind=AuditKind.MODEL_CREATED, actor=_actor(user), message=f"Model {model.name} registered")


def model_changed(model: RegisteredModel, user, changed: dict) -> AuditEvent:
    shown = {field: _shown(value) for field, value in changed.items()}
    words = "; ".join(f"{field} {value}" for field, value in shown.items())
    return AuditEvent.objects.create(model=model, kind=AuditKind.MODEL_CHANGED, actor=_actor(user), message=f"Model {model.name} changed: {words}",
                                     data={"changed": shown})


def version_changed(version: ModelVersion, user, changed: dict) -> AuditEvent:
    shown = {field: _shown(value) for field, value in changed.items()}
    words = "; ".join(f"{field} {value}" for field, value in shown.items())
    return AuditEvent.objects.create(model=version.model, kind=AuditKind.VERSION_CHANGED, actor=_actor(user),
                                     message=f"Version {version.number} of {version.model.name} changed: {words}",
                                     data={"version": version.number, "changed": shown})


def _shown(value) -> str:
    if isinstance(value, list):
        return ", ".join(value) or "none"
    if isinstance(value, dict):  # a model's analysis thresholds: each setting it overrides
        return (", ".join(f"{key} {item}" for key, item in sorted(value.items())) or "the defaults")[:200]
    if hasattr(value, "get_username"):
        return value.get_username()
    return "none" if value in (None, "") else str(value)[:200]


def model_archived(model: RegisteredModel, user, reason: str, release: Release | None = None) -> AuditEvent:
    served = f"; it stopped serving at generation {release.generation}" if release else ""
    return AuditEvent.objects.create(model=model, kind=AuditKind.MODEL_ARCHIVED, actor=_actor(user),
                                     message=f"Model {model.name} archived{served}{f': {reason}' if reason else ''}",
                                     data={"reason": reason, "generation": release.generation if release else None})


def model_restored(model: RegisteredModel, user, reason: str, release: Release | None = None, outcome: str = "") -> AuditEvent:
    return AuditEvent.objects.create(model=model, kind=AuditKind.MODEL_RESTORED, actor=_actor(user),
                                     message=f"Model {model.name} restored from the archive{f'; {outcome}' if outcome else ''}{f': {reason}' if reason else ''}",
                                     data={"reason": reason, "generation": release.generation if release else None})


def version_uploaded(version: ModelVersion, user) -> AuditEvent:
    return AuditEvent.objects.create(
        model=version.model,
        kind=AuditKind.VERSION_UPLOADED,
        actor=_actor(user),
        message=f"Version {version.number} uploaded and validated ({version.size_bytes} bytes, sha256 {version.sha256[:12]}){_compatibility_clause(version)}",
        data={"version": version.number, "sha256": version.sha256, **_compatibility_data(version)},
    )


def _compatibility_clause(version: ModelVersion) -> str:
    compatibility = version.validation_report.get("compatibility") or {}
    if compatibility.get("stable_version") is None:
        return ""
    if compatibility["compatible"]:
        return f"; compatible with stable v{compatibility['stable_version']}"
    return f"; incompatible with stable v{compatibility['stable_version']}: {'; '.join(compatibility['differences'])}"


def _compatibility_data(version: ModelVersion) -> dict:
    compatibility = version.validation_report.get("compatibility") or {}
    if compatibility.get("stable_version") is None:
        return {}
    return {"compatible_with_stable": compatibility["compatible"], "stable_version": compatibility["stable_version"]}


def upload_refused(model: RegisteredModel, user, reason: str, sha256: str = "") -> AuditEvent:
    return AuditEvent.objects.create(
        model=model, kind=AuditKind.UPLOAD_REFUSED, actor=_actor(user), message=f"Upload refused: {reason}", data={"sha256": sha256}
    )


def version_rejected(version: ModelVersion, reason: str, *, actor=None) -> AuditEvent:
    """The validation job refused a stored version (an upload refused after its answer),
    or ``actor`` cancelled its validation."""
    return AuditEvent.objects.create(
        model=version.model, kind=AuditKind.UPLOAD_REFUSED, actor=_actor(actor or version.uploaded_by),
        message=f"Upload refused: version {version.number} rejected: {reason}", data={"version": version.number, "sha256": version.sha256},
    )


def version_archived(version: ModelVersion) -> AuditEvent:
    return AuditEvent.objects.create(
        model=version.model, kind=AuditKind.VERSION_ARCHIVED, message=f"Version {version.number} archived by retention; artifact deleted", data={"version": version.number}
    )


def release_made(release: Release, message: str, *, forced: list[str] | None = None, evaluated_worse: list[str] | None = None) -> AuditEvent:
    data = {"generation": release.generation, "routes": release.routes, "action": release.action, "reason": release.reason}
    if forced:
        data["forced"] = forced
    if evaluated_worse:
        data["evaluated_worse"] = evaluated_worse
    return AuditEvent.objects.create(model=release.model, kind=AuditKind.RELEASE, actor=release.actor, message=message, data=data)


def rollout_event(rollout: Rollout, user, message: str, data: dict) -> AuditEvent:
    return AuditEvent.objects.create(
        model=rollout.model, kind=AuditKind.ROLLOUT, actor=_actor(user), message=message,
        data={"rollout": rollout.pk, "generation": rollout.release_generation or None, **data},
    )


def drill_finished(drill: Drill) -> AuditEvent:
    # The summary first: "failed: last ack none, 0 failed requests" said neither why it
    # failed nor that the count was unknown.
    summary = f"{drill.error}. " if drill.error else ""
    return AuditEvent.objects.create(
        model=drill.model,
        kind=AuditKind.DRILL,
        actor=drill.actor,
        message=f"Rollback drill {drill.status}: {summary}Last ack {_seconds(drill.last_ack_s)}, {_failed_requests(drill)}",
        data={"drill": drill.pk, "status": drill.status},
    )


def drill_roll_forward_settled(drill: Drill, outcome: str) -> AuditEvent:
    """The console's sweep made (or ruled out) the roll forward a drill's own request could
    not: the timeline said only what the drill left in force."""
    return AuditEvent.objects.create(
        model=drill.model, kind=AuditKind.DRILL, actor=None, message=f"Rollback drill #{drill.pk}: {outcome}",
        data={"drill": drill.pk, "status": drill.status, "generation": drill.forward_generation},
    )


def _failed_requests(drill: Drill) -> str:
    """The drill's failed requests in words: a count only when every worker's is known."""
    if drill.failed_requests is not None:
        return f"{drill.failed_requests} failed requests"
    rows = [row for row in drill.workers if isinstance(row, dict)]
    counted = [row["failed_requests"] for row in rows if row.get("failed_requests") is not None]
    if not counted:
        return "failed requests unknown"
    return f"at least {sum(counted)} failed requests (unknown for {len(rows) - len(counted)} of {len(rows)} workers)"


def dataset_added(dataset: EvaluationDataset, user) -> AuditEvent:
    return AuditEvent.objects.create(
        model=dataset.model,
        kind=AuditKind.DATASET_ADDED,
        actor=_actor(user),
        message=f"Data set {dataset.name} added ({dataset.task}, {dataset.rows} rows, {dataset.size_bytes} bytes, sha256 {dataset.sha256[:12]})",
        data={"dataset": dataset.name, "task": dataset.task, "rows": dataset.rows, "sha256": dataset.sha256},
    )


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f} s"


def batch_job_submitted(job: Job, user) -> AuditEvent:
    return AuditEvent.objects.create(
        model=job.model, kind=AuditKind.JOB, actor=_actor(user),
        message=f"Batch job #{job.pk} submitted on version {job.version.number}",
        data={"job": job.pk, "job_kind": job.kind, "version": job.version.number},
    )


def job_cancelled(job: Job, user) -> AuditEvent:
    version = f" of version {job.version.number}" if job.version_id else ""
    return AuditEvent.objects.create(
        model=job.model, kind=AuditKind.JOB, actor=_actor(user), message=f"{job.get_kind_display()} job #{job.pk}{version} cancelled",
        data={"job": job.pk, "job_kind": job.kind, "version": job.version.number if job.version_id else None},
    )
