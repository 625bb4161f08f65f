"""The model catalogue: registering a model, changing its description, tags and owner (and a
version's description), archiving it and restoring it. Each change is one transaction with its audit event.

Archiving a served model is a traffic change as well as a flag: ``releases.archive_traffic``
appends a release with no routes (workers unload the model), under the serving-generation
lock that every traffic change and ``releases.route_first_version`` take, so nothing is
routed to an archived model afterwards (``releases`` checks ``archived_at`` under that
lock) and uploads to it are refused (``uploads``). Restoring brings back the routes served
before the archive in a new release (``releases.restore_from_archive``), or only the flag
when those versions are gone. A model never served is archived and restored by the flag.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from registry.actions import events, releases
from registry.domain.tags import check_tags
from registry.domain.traffic import Route
from registry.models import ModelVersion, RegisteredModel, Release, ServingGeneration

UNSET = object()  # "not given": owner=None means nobody


class CatalogError(Exception):
    """A catalogue change that cannot be made; ``status`` is the HTTP answer."""

    status = 400

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class CatalogConflict(CatalogError):
    status = 409


def create_model(name: str, *, created_by, description: str = "", tags: list[str] | None = None, owner=UNSET, **batching) -> RegisteredModel:
    """A new model, owned by its creator unless ``owner`` says otherwise (None: nobody)."""
    creator = created_by if created_by is not None and created_by.is_authenticated else None
    _refuse_a_name_differing_only_by_case(name)
    try:
        with transaction.atomic():
            model = RegisteredModel.objects.create(
                name=name, description=description, tags=check_tags(tags or []), owner=creator if owner is UNSET else owner,
                created_by=creator, **batching,
            )
            events.model_created(model, created_by)
    except IntegrityError:
        _refuse_a_name_differing_only_by_case(name)  # created meanwhile
        raise CatalogConflict(f"a model named {name!r} already exists") from None
    return model


def _refuse_a_name_differing_only_by_case(name: str) -> None:
    other = RegisteredModel.objects.filter(name__iexact=name).exclude(name=name).values_list("name", flat=True).first()
    if other is not None:
        raise CatalogConflict(f"a model named {other!r} exists: model names must differ by more than case")


def change_model(model: RegisteredModel, actor, *, description=UNSET, tags=UNSET, owner=UNSET, analysis=UNSET) -> RegisteredModel:
    """Change what is given; the audit event lists what changed (nothing: no event).
    ``analysis``: the canary analysis thresholds its rollouts start with, checked by the
    caller (``rollouts.resolve_analysis``); audited like the rest, since loosening them is
    how automatic rollback is switched off."""
    given = {"description": description, "tags": tags, "owner": owner, "analysis": analysis}
    changes = {field: value for field, value in given.items() if value is not UNSET}
    if "tags" in changes:
        changes["tags"] = check_tags(changes["tags"])
    with transaction.atomic():
        locked = RegisteredModel.objects.select_for_update().get(pk=model.pk)
        changed = {field: value for field, value in changes.items() if getattr(locked, field) != value}
        for field, value in changed.items():
            setattr(locked, field, value)
        if changed:
            locked.save(update_fields=list(changed))
            events.model_changed(locked, actor, changed)
    return locked


def change_version(version: ModelVersion, actor, *, description: str) -> ModelVersion:
    """A version's description, as for a model's (the audit event says what it became;
    unchanged: no event). Any version, archived or rejected too: it is what the registry
    keeps of it. An upload starts when its file is chosen, so a description typed after
    that went with nothing; this is where it is set."""
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().select_related("model").get(pk=version.pk)
        if locked.description != description:
            locked.description = description
            locked.save(update_fields=["description"])
            events.version_changed(locked, actor, {"description": description})
    return locked


def archive(model: RegisteredModel, actor, reason: str = "") -> tuple[RegisteredModel, Release | None]:
    """The archived model, and the release that stopped serving it (None: it served nothing)."""
    with transaction.atomic():
        ServingGeneration.objects.lock()
        locked = RegisteredModel.objects.select_for_update().get(pk=model.pk)
        if locked.is_archived:
            raise CatalogConflict(f"{locked.name} is archived already")
        release = releases.archive_traffic(locked, actor, reason)
        locked.archived_at = timezone.now()
        locked.save(update_fields=["archived_at"])
        events.model_archived(locked, actor, reason, release)
    return locked, release


def unarchive(model: RegisteredModel, actor, reason: str = "") -> tuple[RegisteredModel, Release | None, str]:
    """The restored model, the release that serves it again (None: it serves nothing
    yet) and what happened to its traffic, in words."""
    with transaction.atomic():
        ServingGeneration.objects.lock()
        locked = RegisteredModel.objects.select_for_update().get(pk=model.pk)
        if not locked.is_archived:
            raise CatalogConflict(f"{locked.name} is not archived")
        release, outcome = releases.restore_from_archive(locked, actor, reason)
        locked.archived_at = None
        locked.save(update_fields=["archived_at"])
        events.model_restored(locked, actor, reason, release, outcome)
    return locked, release, outcome


def archive_preview(model: RegisteredModel) -> str:
    """What archiving ``model`` does, in words (the confirmation says it)."""
    current = model.current_release()
    if current is None or current.is_archive:
        return f"{model.name} serves nothing: archiving only hides it and refuses uploads and traffic changes until it is restored."
    served = ", ".join(Route.from_json(route).describe() for route in current.routes)
    return f"{served} stops serving on every worker; restore brings back {releases.restored_after_archive(current)}."
