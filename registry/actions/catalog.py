"""The model catalogue: registering a model, changing its description, tags and owner,
archiving it and restoring it. Each change is one transaction with its audit event.

Archiving is refused (``CatalogConflict``, 409) while the model has a release: a release
always routes 100% of the model's traffic somewhere (``releases`` has no "route
nothing"), so an archived model that kept its release would go on serving while the
Models page hides it. What may be archived is a model nothing was ever routed to (no
version became ready); archiving it takes the serving-generation lock, the lock
``releases.route_first_version`` takes, so a version that becomes ready afterwards is
not routed (``releases`` checks ``archived_at`` under that lock), and uploads to an
archived model are refused (``uploads``).
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from registry.actions import events
from registry.domain.tags import check_tags
from registry.domain.traffic import Route
from registry.models import RegisteredModel, ServingGeneration

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
    try:
        with transaction.atomic():
            model = RegisteredModel.objects.create(
                name=name, description=description, tags=check_tags(tags or []), owner=creator if owner is UNSET else owner,
                created_by=creator, **batching,
            )
            events.model_created(model, created_by)
    except IntegrityError:
        raise CatalogError(f"a model named {name!r} already exists") from None
    return model


def change_model(model: RegisteredModel, actor, *, description=UNSET, tags=UNSET, owner=UNSET) -> RegisteredModel:
    """Change what is given; the audit event lists what changed (nothing: no event)."""
    changes = {field: value for field, value in {"description": description, "tags": tags, "owner": owner}.items() if value is not UNSET}
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


def archive(model: RegisteredModel, actor, reason: str = "") -> RegisteredModel:
    with transaction.atomic():
        ServingGeneration.objects.lock()  # serialises with route_first_version
        locked = RegisteredModel.objects.select_for_update().get(pk=model.pk)
        if locked.is_archived:
            raise CatalogConflict(f"{locked.name} is archived already")
        release = locked.current_release()
        if release is not None:
            routes = ", ".join(Route.from_json(route).describe() for route in release.routes)
            raise CatalogConflict(
                f"{locked.name} still takes traffic (generation {release.generation}: {routes}); a release always routes all of "
                "a model's traffic to a version, so only a model that was never served can be archived: nothing was changed"
            )
        locked.archived_at = timezone.now()
        locked.save(update_fields=["archived_at"])
        events.model_archived(locked, actor, reason)
    return locked


def unarchive(model: RegisteredModel, actor, reason: str = "") -> RegisteredModel:
    with transaction.atomic():
        locked = RegisteredModel.objects.select_for_update().get(pk=model.pk)
        if not locked.is_archived:
            raise CatalogConflict(f"{locked.name} is not archived")
        locked.archived_at = None
        locked.save(update_fields=["archived_at"])
        events.model_restored(locked, actor, reason)
    return locked
