"""Console pages of the model catalogue: register a model, change its description, tags
and owner (and a version's description), archive and restore it. Each is a form post (act, message, redirect) that
calls ``registry.actions.catalog``; a refused form is shown again with its errors."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from console import forms
from console.views import _answer, _first_error, _model, _version, model_context, operator_required, version_context
from registry.actions import catalog


@require_http_methods(["GET", "POST"])
def create_model(request):
    """The Models page's form posts here. A GET is someone who typed /models/ for the list
    of models (it showed them an empty form): they are sent to it, where the form is too."""
    if request.method == "GET":
        return redirect("models")
    return _create_model(request)


@operator_required
def _create_model(request):
    form = forms.ModelCreateForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            model = catalog.create_model(data["name"], created_by=request.user, description=data["description"], tags=data["tags"], owner=data["owner"])
        except catalog.CatalogError as error:
            form.add_error("name", error.message)
        else:
            messages.success(request, f"Model {model.name} registered. Upload its first version below.")
            return redirect("model", name=model.name)
    return render(request, "console/model_new.html", {"nav": "models", "create_form": form}, status=400)


@require_POST
@operator_required
def change_model(request, name: str):
    model = _model(name)
    form = forms.ModelDetailsForm(request.POST)
    if not form.is_valid():
        context = {**model_context(model), "details_form": form, "details_open": True}
        return render(request, "console/model.html", context, status=400)
    data = form.cleaned_data
    catalog.change_model(model, request.user, description=data["description"], tags=data["tags"], owner=data["owner"])
    messages.success(request, f"Details of {model.name} saved.")
    return redirect("model", name=model.name)


@require_POST
@operator_required
def change_version(request, name: str, number: int):
    version = _version(name, number)
    form = forms.VersionDetailsForm(request.POST)
    if not form.is_valid():
        context = version_context(version, version_form=form, version_details_open=True)
        return render(request, "console/version.html", context, status=400)
    catalog.change_version(version, request.user, description=form.cleaned_data["description"])
    messages.success(request, f"Description of {version.model.name} v{version.number} saved.")
    return redirect("version", name=version.model.name, number=version.number)


@require_http_methods(["GET", "POST"])
@operator_required
def archive_model(request, name: str):
    model = _model(name)
    if request.method == "GET":
        return render(request, "console/confirm.html", {"nav": "models", "model": model, "standalone": True,
                                                        "archive_preview": catalog.archive_preview(model),
                                                        "confirm_fragment": "console/fragments/confirm_archive.html"})
    form = forms.ArchiveForm(request.POST)
    if not form.is_valid():  # never archived with the operator's reason dropped unsaid
        return _answer(request, model.name, "error", f"Not archived: {_first_error(form)}", status=400)
    try:
        _, release = catalog.archive(model, request.user, form.cleaned_data["reason"])
    except catalog.CatalogError as error:
        return _refused(request, model, error)
    served = f" It stopped serving at generation {release.generation}; workers are unloading it." if release else ""
    messages.success(request, f"{model.name} archived: it is hidden from the Models page and takes no uploads.{served}")
    return redirect("model", name=model.name)


@require_POST
@operator_required
def unarchive_model(request, name: str):
    model = _model(name)
    form = forms.ArchiveForm(request.POST)
    if not form.is_valid():
        return _answer(request, model.name, "error", f"Not restored: {_first_error(form)}", status=400)
    try:
        _, _, outcome = catalog.unarchive(model, request.user, form.cleaned_data["reason"])
    except catalog.CatalogError as error:
        return _refused(request, model, error)
    messages.success(request, f"{model.name} restored from the archive: {outcome}.")
    return redirect("model", name=model.name)


def _refused(request, model, error: catalog.CatalogError):
    messages.error(request, f"Not done: {error.message}")
    return redirect("model", name=model.name)
