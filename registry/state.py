"""The desired serving state: the whole truth workers converge to, never a diff."""

from __future__ import annotations

from django.conf import settings
from django.urls import reverse

from registry.models import ModelVersion, RegisteredModel, Release, ServingGeneration


def current_generation() -> int:
    counter = ServingGeneration.objects.filter(pk=1).first()
    return counter.generation if counter else 0


def desired_state() -> dict:
    """``{generation, models: {name: {routes, warm, batching}}}`` as in docs/architecture.md."""
    models = {}
    for model in RegisteredModel.objects.all():
        release = model.current_release()
        if release is not None:
            models[model.name] = model_state(model, release)
    return {"generation": current_generation(), "models": models}


def model_state(model: RegisteredModel, release: Release) -> dict:
    versions = {version.number: version for version in model.versions.all()}
    routed = release.routed_versions()
    return {
        "generation": release.generation,
        "routes": [{**route, **_artifact(versions[route["version"]])} for route in release.routes],
        "warm": [{"version": number, **_artifact(versions[number])} for number in warm_versions(release) if number not in routed],
        "batching": batching(model),
    }


def warm_versions(release: Release) -> list[int]:
    """Versions of the rollback target, kept loaded so a rollback is only a swap."""
    target = release.rollback_target
    return [] if target is None else target.routed_versions()


def batching(model: RegisteredModel) -> dict:
    return {
        "max_batch_size": model.max_batch_size or settings.SERVING_DEFAULT_MAX_BATCH_SIZE,
        "max_queue_delay_s": model.max_queue_delay_s if model.max_queue_delay_s is not None else settings.SERVING_DEFAULT_MAX_QUEUE_DELAY_S,
        "max_queue_size": settings.SERVING_DEFAULT_MAX_QUEUE_SIZE,
        "latency_target_s": model.latency_target_s,
    }


def _artifact(version: ModelVersion) -> dict:
    return {
        "sha256": version.sha256,
        "artifact_url": reverse("api-version-artifact", kwargs={"name": version.model.name, "number": version.number}),
        "signature": version.signature,
    }
