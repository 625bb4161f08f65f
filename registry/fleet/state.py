"""The desired serving state: the whole truth workers converge to, never a diff.

A state is a function of its generation: the newest release of each model at or below
it, unless that release archived the model (then the model is left out, and workers
unload it). The model's ``archived_at`` flag is never read here: it is today's fact, and
a state issued before the archive must recompute to the same digest. Reading the counter first and then only releases up to it gives a consistent state
without a transaction (generations commit gap-free with their release), and lets the
console recompute any state it issued to check what a worker acks.
"""

from __future__ import annotations

from dataclasses import replace

from django.conf import settings
from django.urls import reverse

from registry.fleet.issued_mark import note_issued
from registry.models import ModelVersion, RegisteredModel, Release, ServingGeneration, VersionStatus
from serving.contract import BatchPolicy, DesiredState, ModelState, Route, WarmVersion
from serving.state_signing import state_digest


def current_generation() -> int:
    return serving_counter()[0]


def serving_counter() -> tuple[int, str]:
    """(generation, epoch) of this database's serving counter."""
    counter = ServingGeneration.objects.filter(pk=1).first()
    return (counter.generation, counter.epoch) if counter else (0, "")


def desired_state() -> dict:
    """The current state, as ``GET /api/serving/state`` answers it (``serving.contract``),
    noted as issued (``fleet.issued_mark``)."""
    state = current_state()
    note_issued(state.epoch, state.generation)
    return state.to_dict()


def current_state() -> DesiredState:
    generation, epoch = serving_counter()
    return build_state(generation, epoch)


def state_at(generation: int, epoch: str) -> dict:
    """The state the console issued as ``generation``."""
    return build_state(generation, epoch, current=serving_counter()[0]).to_dict()


def build_state(generation: int, epoch: str, *, current: int | None = None) -> DesiredState:
    """The state of ``generation``, with the digest of its content (the contract version
    included). ``current``: the newest generation, when ``generation`` may be older."""
    models = {}
    past = current is not None and generation < current
    for model in RegisteredModel.objects.all():
        release = model.releases.filter(generation__lte=generation).order_by("-generation").first()
        if release is not None and not release.is_archive:
            models[model.name] = model_state(model, release, past=past)
    state = DesiredState(generation=generation, epoch=epoch, models=models)
    return replace(state, digest=state_digest(state))


def issued_digest(generation: int) -> str | None:
    """The digest of the state issued as ``generation`` in this epoch; None if never issued."""
    state = issued_state(generation)
    return state.digest if state else None


def issued_state(generation: int) -> DesiredState | None:
    """The state issued as ``generation`` in this epoch, with its digest; None if never issued."""
    current, epoch = serving_counter()
    if generation > current:
        return None
    return build_state(generation, epoch, current=current)


def model_state(model: RegisteredModel, release: Release, *, past: bool = False) -> ModelState:
    versions = {version.number: version for version in model.versions.all()}
    routed = release.routed_versions()
    routes = tuple(
        Route(version=route["version"], weight=route["weight"], shadow=route.get("shadow"), **_artifact(versions[route["version"]]))
        for route in release.routes
    )
    # Only versions with an artifact: a rollback chain walked back past retention's depth
    # names archived ones, whose 410 would fail every worker's whole state. A past state
    # (recomputed for its digest only) keeps one archived since its release, as issued:
    # retention archives a warm version only once its release is no longer current.
    warm = tuple(WarmVersion(version=number, **_artifact(versions[number])) for number in warm_versions(release)
                 if number not in routed and _had_artifact(versions[number], release, past))
    return ModelState(routes=routes, warm=warm, batching=batching(model), generation=release.generation)


def _had_artifact(version: ModelVersion, release: Release, past: bool) -> bool:
    if version.status == VersionStatus.READY:
        return True
    # Never for the state workers fetch: clocks of two processes decide, and a wrong call
    # there would be a 410 for every worker, where here it is at worst another digest.
    return (past and version.status == VersionStatus.ARCHIVED and version.archived_at is not None
            and version.archived_at > release.created_at)


def warm_versions(release: Release) -> list[int]:
    """Versions of the rollback target, kept loaded so a rollback is only a swap."""
    target = release.rollback_target
    return [] if target is None or release.is_archive else target.routed_versions()


def batching(model: RegisteredModel) -> BatchPolicy:
    return BatchPolicy(
        max_batch_size=model.max_batch_size or settings.SERVING_DEFAULT_MAX_BATCH_SIZE,
        max_queue_delay_s=model.max_queue_delay_s if model.max_queue_delay_s is not None else settings.SERVING_DEFAULT_MAX_QUEUE_DELAY_S,
        max_queue_size=settings.SERVING_DEFAULT_MAX_QUEUE_SIZE,
        latency_target_s=model.latency_target_s,
    )


def _artifact(version: ModelVersion) -> dict:
    return {
        "sha256": version.sha256,
        "artifact_url": reverse("api-version-artifact", kwargs={"name": version.model.name, "number": version.number}),
        "signature": version.signature,
    }
