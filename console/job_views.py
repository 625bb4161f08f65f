"""The Jobs tab of a model: every background job (validation, benchmark, evaluation,
batch inference) with its progress, and the forms that start a batch job, add an
evaluation data set and cancel a job. Page twins of the jobs and data sets API: the rules
live in ``registry.actions.batch_jobs``, ``registry.actions.datasets`` and
``registry.jobs.records``; these views parse, call, and say what happened.

Both forms carry a file. As with a version upload, the body is parsed only after the
role check, so a viewer's or a stranger's file is never written anywhere. A refusal
re-renders the tab with the reason beside the form and the refusal's 4xx status; a
script posting with ``Accept: application/json`` gets ``{"level", "message"}``.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from console import forms
from console.views import (
    _first_error,
    _model,
    _page,
    _refuse_forgery,
    _wants_json,
    operator_required,
)
from registry.actions import batch_jobs, datasets
from registry.artifacts import storage
from registry.artifacts.upload_handler import (
    csrf_failure,
    csrf_failure_from_headers,
    declared_too_large,
    start_staging,
)
from registry.domain.choices import JobStatus, VersionStatus
from registry.jobs import records
from registry.models import Job, RegisteredModel

logger = logging.getLogger(__name__)
JOBS_SHOWN = 100
ACTIVE_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)
JOBS_FRAGMENTS = {
    "jobs-table": "console/fragments/jobs_table.html",
    "datasets": "console/fragments/datasets_table.html",
}


@login_required
def jobs_page(request, name: str):
    return _page(request, "console/jobs.html", jobs_context(_model(name)), JOBS_FRAGMENTS)


def jobs_context(model: RegisteredModel, **extra) -> dict:
    release = model.current_release()
    stable = release.stable_version if release else None
    context = {
        "nav": "models",
        "model": model,
        "jobs": job_rows(model),
        "datasets": model.datasets.select_related("created_by"),
        "ready_versions": list(model.versions.filter(status=VersionStatus.READY).order_by("-number").values_list("number", flat=True)),
        "stable_version": stable,
        "batch_form": forms.BatchJobForm(),
        "dataset_form": forms.DatasetForm(initial={"task": "classification"}),
        "jobs_api_url": reverse("api-jobs", kwargs={"name": model.name}),
        "jobs_config": {"model": model.name, "page": "jobs"},
    }
    context.update(extra)
    return context


def job_rows(model: RegisteredModel) -> list[dict]:
    jobs = model.jobs.select_related("model", "version", "dataset", "created_by", "cancelled_by")[:JOBS_SHOWN]
    return [job_row(job) for job in jobs]


def job_row(job: Job) -> dict:
    total = job.total or 0
    return {
        "job": job,
        "is_active": job.status in ACTIVE_STATUSES,
        "percent": min(100, job.done * 100 // total) if total else None,
        "output_available": records.output_available(job),
        "output_url": reverse("api-job-output", kwargs={"name": job.model.name, "job_id": job.pk}),
    }


# ---------------------------------------------------------------- answers


def _done(request, model: RegisteredModel, text: str, **extra):
    if _wants_json(request):
        return JsonResponse({"level": "success", "message": text, **extra})
    messages.success(request, text)
    return redirect("model-jobs", name=model.name)


def _refused(request, model: RegisteredModel, text: str, status: int, **forms_shown):
    """The tab again, the reason in its messages and beside the form that was sent."""
    if _wants_json(request):
        return JsonResponse({"level": "error", "message": text}, status=status)
    messages.error(request, text)
    return render(request, "console/jobs.html", jobs_context(model, **forms_shown), status=status)


def _with_upload(request, model: RegisteredModel, act, max_bytes: int):
    """``act(request, model)`` with the file parts staged (after the role check, which
    the decorators did), and removed again whatever happened. CSRF as for a version
    upload: a script's header token is checked before the body is read."""
    if declared_too_large(request, max_bytes):
        return _refused(request, model, str(storage.UploadTooLarge(max_bytes)), 413)
    token_in_header = settings.CSRF_HEADER_NAME in request.META
    if token_in_header:
        _refuse_forgery(csrf_failure_from_headers(request))
    staging = start_staging(request, max_bytes)
    try:
        if not token_in_header:
            _refuse_forgery(csrf_failure(request))
        if getattr(request, "upload_too_large", False):
            return _refused(request, model, str(storage.UploadTooLarge(max_bytes)), 413)
        return act(request, model)
    except OSError as error:
        refusal = storage.write_refusal(error)
        if refusal is None:
            raise
        logger.error("the artifact store could not keep an upload for %s: %s", model.name, error)
        return _refused(request, model, refusal[1], refusal[0])
    finally:
        staging.discard()  # whatever the action kept, it has copied or moved


# ---------------------------------------------------------------- batch jobs


@csrf_exempt  # checked in _with_upload, before or while the body is parsed
@require_POST
@operator_required
def new_batch_job(request, name: str):
    return _with_upload(request, _model(name), _submit_batch, settings.JOB_MAX_INPUT_BYTES)


def _submit_batch(request, model: RegisteredModel):
    form = forms.BatchJobForm(request.POST, request.FILES)
    if not form.is_valid():
        return _refused(request, model, f"Batch job not started: {_first_error(form)}", 400, batch_form=form)
    data = form.cleaned_data
    try:
        job = batch_jobs.submit(model, data["input"], version_number=data["version"], batch_size=data["batch_size"], created_by=request.user)
    except batch_jobs.JobRefused as refusal:
        form.add_error(None, refusal.reason)
        return _refused(request, model, f"Batch job not started: {refusal.reason}", refusal.status, batch_form=form)
    version = f" through v{job.version.number}" if job.version_id else ""
    return _done(request, model, f"Batch job #{job.pk} queued: {job.input_name or 'the file'}{version}. Its progress shows below.", job=job.pk)


# ---------------------------------------------------------------- data sets


@csrf_exempt  # checked in _with_upload, before or while the body is parsed
@require_POST
@operator_required
def new_dataset(request, name: str):
    return _with_upload(request, _model(name), _add_dataset, settings.DATASET_MAX_BYTES)


def _add_dataset(request, model: RegisteredModel):
    form = forms.DatasetForm(request.POST, request.FILES)
    if not form.is_valid():
        return _refused(request, model, f"Data set not added: {_first_error(form)}", 400, dataset_form=form)
    data = form.cleaned_data
    try:
        dataset = datasets.add(model, data["file"], name=data["name"], task=data["task"], description=data["description"], created_by=request.user)
    except datasets.DatasetRefused as refusal:
        form.add_error(None, refusal.reason)
        return _refused(request, model, f"Data set not added: {refusal.reason}", refusal.status, dataset_form=form)
    text = f"Data set {dataset.name} added ({dataset.rows} rows, {dataset.get_task_display().lower()}): every ready version is evaluated on it."
    return _done(request, model, text, dataset=dataset.name)


# ---------------------------------------------------------------- cancel


@require_http_methods(["GET", "POST"])
@operator_required
def cancel_job(request, name: str, pk: int):
    """Asked first, as every other destructive action of the console is: the row's Cancel
    opens this confirmation in a dialog (GET answers it as a page without JavaScript)."""
    model = _model(name)
    job = get_object_or_404(model.jobs.select_related("model", "version", "dataset"), pk=pk)
    if request.method == "GET":
        return render(request, "console/confirm.html", {"nav": "models", "model": model, "standalone": True, "job": job, "row": job_row(job),
                                                        "confirm_fragment": "console/fragments/confirm_cancel_job.html"})
    if records.is_finished(job):
        return _refused(request, model, f"Job #{job.pk} has already finished ({job.get_status_display().lower()}): nothing to cancel.", 409)
    job = records.cancel(job, request.user)
    if job.status == JobStatus.CANCELLED:
        return _done(request, model, f"Job #{job.pk} cancelled before it started.", job=job.pk)
    if job.status == JobStatus.RUNNING:
        return _done(request, model, f"Job #{job.pk}: cancel requested, it stops within a second.", job=job.pk)
    # It finished between the check and the lock.
    return _refused(request, model, f"Job #{job.pk} has already finished ({job.get_status_display().lower()}): nothing to cancel.", 409)
