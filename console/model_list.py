"""The Models page's list: searched, filtered and sorted in the database from the query
string (so a link shares the view), fifty to a page; only the page's rows are rendered.

Sorting by requests/s orders by the live figures the page shows (summed from the live
workers' latest reports, already in memory), so it needs the names of every matching
model, not their rows.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.db.models import DateTimeField, F, Max, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce, Greatest

from console.forms import MODEL_SORTS, ModelListForm
from registry.models import ModelVersion, RegisteredModel, Release

PAGE_SIZE = 50


def list_form(params) -> ModelListForm:
    """The query string as a form; a value that no longer fits (a tag nobody uses now)
    is left out of ``cleaned_data`` and the rest still applies."""
    tags = sorted({tag for tags in RegisteredModel.objects.values_list("tags", flat=True) for tag in tags or []})
    owners = sorted(set(RegisteredModel.objects.filter(owner__isnull=False).values_list("owner__username", flat=True)))
    form = ModelListForm(params, tags=tags, owners=owners)
    form.is_valid()
    return form


def matching_models(options: dict) -> QuerySet[RegisteredModel]:
    models = RegisteredModel.objects.select_related("owner")
    if not options.get("archived"):
        models = models.active()
    if options.get("q"):
        models = models.matching(options["q"].strip())
    if options.get("tag"):
        models = models.tagged(options["tag"])
    if options.get("owner"):
        models = models.filter(owner__username=options["owner"])
    return models


def with_last_update(models: QuerySet[RegisteredModel]) -> QuerySet[RegisteredModel]:
    """``updated_at``: the newest of the model's creation, its versions and its releases."""
    return models.annotate(updated_at=Greatest(
        F("created_at"), Coalesce(_newest(ModelVersion.objects), F("created_at")), Coalesce(_newest(Release.objects), F("created_at")),
        output_field=DateTimeField(),
    ))


def _newest(rows) -> Subquery:
    """The newest ``created_at`` of the model's rows (versions or releases)."""
    return Subquery(rows.filter(model=OuterRef("pk")).order_by().values("model").annotate(at=Max("created_at")).values("at"))


def sorted_models(models: QuerySet[RegisteredModel], sort: str, figures: dict) -> QuerySet[RegisteredModel] | list[RegisteredModel]:
    models = with_last_update(models)
    if sort == "updated":
        return models.order_by("-updated_at", "name")
    if sort == "created":
        return models.order_by("-created_at", "name")
    if sort == "requests":
        rates: dict[str, float] = {}
        for (name, _), entry in figures.items():
            rates[name] = rates.get(name, 0.0) + (entry.get("requests_per_s") or 0.0)
        return sorted(models.order_by("name"), key=lambda model: -rates.get(model.name, 0.0))
    return models.order_by("name")


def page_of(models, number: int | None):
    return Paginator(models, PAGE_SIZE).get_page(number or 1)


def query_string(options: dict, **changes) -> str:
    """The page's query string with ``changes``; empty values left out."""
    merged = {**options, **changes}
    return urlencode({key: ("true" if value is True else value) for key, value in merged.items() if value not in (None, "", False)})


def sort_label(sort: str) -> str:
    return MODEL_SORTS.get(sort, MODEL_SORTS["name"])
