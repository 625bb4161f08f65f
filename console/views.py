"""Web console pages.

Views translate: a request becomes a call to a registry function (``releases``,
``uploads``, ``drills``), its answer becomes a page, a message or a fragment. The rules
live in ``registry``. Every state change is a POST page twin (act, message, redirect);
the page's JavaScript may send the same POST with ``Accept: application/json`` and gets
``{"level", "message"}`` back instead of a redirect, so charts keep their history.
Each page renders its parts from fragments, and ``?fragment=NAME`` answers one of them
alone: the same template on page load and on a live update.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import timedelta
from functools import wraps
from urllib.parse import urlencode

import httpx
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.sessions.exceptions import SessionInterrupted
from django.core.exceptions import BadRequest, PermissionDenied, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.db.models import Sum
from django.http import HttpResponse, JsonResponse
from django.middleware.csrf import REASON_NO_CSRF_COOKIE
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from console import forms, model_list, outage, readiness
from console.metric_summaries import (
    evaluation_context,
    headline,
    measuring,
    version_metrics_context,
)
from console.summaries import (
    canary_route,
    describe_routes,
    duration_words,
    health,
    live_figures,
    model_figures,
    recent_traffic,
    releases_in_force,
    report_totals,
    rollout_state_key,
    rollout_steps,
    served_since,
    signal_rows,
    split_segments,
    version_roles,
    weighted_canaries,
)
from registry.actions import drills, releases, rollouts, uploads
from registry.api.errors import json_not_found, json_server_error
from registry.api.versions_views import duplicate_details
from registry.artifacts import served_bytes, storage
from registry.artifacts.upload_handler import (
    StagedUploadedFile,
    csrf_failure,
    csrf_failure_from_headers,
    declared_too_large,
    start_staging,
)
from registry.committed_change import committing, mark_committed
from registry.domain import audit_log, version_metrics
from registry.domain.choices import (
    ACTIVE_ROLLOUT_STATUSES,
    ANALYSED_ROLLOUT_STATUSES,
    AuditKind,
    DrillStatus,
    RolloutStatus,
    VersionStatus,
)
from registry.domain.compatibility import input_differences
from registry.domain.roles import can_operate
from registry.fleet import workers as fleet
from registry.fleet.state import current_generation
from registry.models import (
    Drill,
    ModelVersion,
    RegisteredModel,
    Release,
    Rollout,
    RolloutVerdict,
    VersionMetricMinute,
    Worker,
)

logger = logging.getLogger(__name__)
WORKERS_SHOWN_FOR = fleet.GONE_LISTED_FOR  # gone workers stay listed (faded) this long
# Loaded versions listed per worker on the Workers page; the rest are counted. A report may
# list serving.contract.MAX_LOADED (4,096), each a link: five made-up worker ids, one
# report each, made the page 1.9 MB and 2.5 s to render, for the hour they stay listed.
LOADED_SHOWN = 64
ROLLUP_WINDOW = timedelta(hours=6)
SERVED_WINDOW = timedelta(hours=1)  # the versions table's traffic column
TRY_TIMEOUT_S = 10.0
# The most of a worker's answer the "try it" form reads and shows. Read whole, a viewer's
# 27 KB of inputs to a model with a large output had the console take a 200 MB answer, parse
# it and send it back pretty-printed (444 MB): 815 MB to 2.7 GB, 1.5 GB kept after.
TRY_ANSWER_MAX_BYTES = 1024 * 1024
AUDIT_EVENTS_SHOWN = 50
DRILLS_SHOWN = 200
ROLLOUTS_SHOWN = 5


# ---------------------------------------------------------------- errors and health


def not_found(request, exception=None):
    if request.path.startswith("/api/"):
        return json_not_found(request, exception)
    return _error_page("404.html", 404)


UNREADABLE_REQUEST = "the request could not be read"
# What is wrong with the request itself; a Host not allowed names a setting to change, and is not said.
SAID_AS_IS = (BadRequest, TooManyFieldsSent, TooManyFilesSent, RequestDataTooBig)


def bad_request(request, exception=None):
    """handler400, reading nothing of the request. Django's own checks the CSRF token, so it
    read the body again whose charset had made the 400 (a form in UTF-7): under ASGI a 500,
    for anyone. Only a BadRequest's words are shown; a suspicious request's name settings."""
    named = isinstance(exception, SAID_AS_IS) and str(exception)
    message = str(exception) if named else UNREADABLE_REQUEST
    if request.path.startswith("/api/"):
        return JsonResponse({"error": message}, status=400)
    # A session deleted during the request (signed out in another tab) is found when the
    # answer saves it: the request's change may be made already, so "Nothing was changed" is not said.
    context = {"message": message.rstrip(".") if named else "", "charset": named and "UTF-8" in message,
               "unchanged": not isinstance(exception, SessionInterrupted)}
    return HttpResponse(render_to_string("400.html", context), status=400)


def permission_denied(request, exception=None):
    """handler403, without the database like the others (a styled static page)."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": str(exception) if exception and str(exception) else "not allowed"}, status=403)
    return _error_page("403.html", 403)


CSRF_EXPIRED = ("This page's form has expired: your sign-in changed since the page was loaded (you signed out "
                "and in again, maybe in another tab). Nothing was changed: reload the page and try again.")


CSRF_NOT_FROM_HERE = ("This form was not sent from a page of this console (it carried no valid form token, or came from "
                      "another site). Nothing was changed: open the page in the console and send it from there.")


def csrf_refused(request, reason=""):
    """CSRF_FAILURE_VIEW. A stale form is the usual cause (a new sign-in rotates the token):
    said as such, as JSON to the page's scripts (which showed "your role may not do this")
    and as a styled page to a plain form post (Django's own is a bare "CSRF verification
    failed"). A form with no token, or from another origin, is not stale: said otherwise
    (it read "your sign-in changed" to a form that never had a token). Like the other
    error pages it renders without the database."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": f"CSRF check failed ({reason}): send the X-CSRFToken header, or use an API token"}, status=403)
    # Django's REASON_CSRF_TOKEN_INCORRECT (a token of another sign-in), or its cookie gone
    # (cleared, expired): both mend with a reload; a missing token or a foreign origin does not.
    stale = (reason.startswith("CSRF token from") and reason.endswith("incorrect.")) or reason == REASON_NO_CSRF_COOKIE
    if _wants_json(request):
        return JsonResponse({"level": "error", "message": CSRF_EXPIRED if stale else CSRF_NOT_FROM_HERE}, status=403)
    return _error_page("403_csrf.html" if stale else "403_csrf_foreign.html", 403)


def server_error(request):
    """handler500. Renders without the database (no request context: its processors
    read the session and the user); a database error raised in middleware is a 503."""
    error = sys.exc_info()[1]
    if outage.is_database_unavailable(error):
        return outage.database_unavailable_response(request, error)
    if request.path.startswith("/api/"):
        return json_server_error(request)
    return _error_page("500.html", 500)


def _error_page(template: str, status: int) -> HttpResponse:
    return HttpResponse(render_to_string(template), status=status)


def healthz(request):
    """Liveness: the process answers. It checks no dependency (see readyz)."""
    return JsonResponse({"status": "ok"})


def readyz(request):
    """Readiness: the database and Redis, each reported on its own; 503 unless both answer."""
    body = readiness.shared_readiness()
    response = JsonResponse(body, status=200 if body["ready"] else 503)
    response["Cache-Control"] = "no-store"
    if not body["ready"]:
        response["Retry-After"] = str(outage.RETRY_AFTER_S)  # as every other outage 503: when to ask again
    # What the console's handler tells requests it refuses for want of a slot (console.handler).
    database = body["database"]
    response.database_answered = database["ok"]
    response.database_unreachable = not database["ok"] and not database["error"].startswith("read-only")
    return response


# ---------------------------------------------------------------- plumbing


def operator_required(view):
    """Signed in first; then a role that may only read gets 403 and nothing runs."""

    @login_required
    @wraps(view)
    def guarded(request, *args, **kwargs):
        if not can_operate(request.user):
            raise PermissionDenied("your role may only read: operators and admins make changes")
        return view(request, *args, **kwargs)

    return guarded


def _wants_json(request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def _answer(request, model_name: str, level: str, text: str, *, status: int = 200, **extra):
    """A fetch gets JSON; a plain form post gets a message and a redirect to the model.
    A success answers a committed change: saving its message needs the database, and
    should that fail the outage page says the change was made instead of "try again"."""
    if level == "success":
        mark_committed(request, f"{model_name}: {text}")
    if _wants_json(request):
        return JsonResponse({"level": level, "message": text, **extra}, status=status)
    messages.add_message(request, messages.SUCCESS if level == "success" else messages.ERROR, text)
    return redirect("model", name=model_name)


def _page(request, template: str, context: dict, fragments: dict[str, str]):
    """The whole page, or one of its fragments when ``?fragment=`` names it."""
    fragment = fragments.get(request.GET.get("fragment", ""))
    return render(request, fragment or template, context)


def _first_error(form) -> str:
    for field, errors in form.errors.items():
        label = "" if field == "__all__" else f"{form.fields[field].label or field}: "
        return label + errors[0]
    return "invalid form"


def _model(name: str) -> RegisteredModel:
    return get_object_or_404(RegisteredModel, name=name)


# ---------------------------------------------------------------- models page


@login_required
def models_page(request):
    context = {"nav": "models", **_model_rows(request.GET), "gone_after_s": settings.WORKER_GONE_AFTER_S}
    return _page(request, "console/models.html", context, {"models-table": "console/fragments/models_table.html"})


def _model_rows(params) -> dict:
    """One page of the models the query string asks for (``console.model_list``)."""
    figures = live_figures(list(fleet.live_workers()))
    recent = recent_traffic()
    form = model_list.list_form(params)
    options = {key: form.cleaned_data.get(key) for key in ("q", "tag", "owner", "sort", "archived")}
    page = model_list.page_of(model_list.sorted_models(model_list.matching_models(options), options["sort"] or "name", figures), form.cleaned_data.get("page"))
    view = fleet.FleetView()  # the workers and issued digests, read once for every row
    return {"rows": [_model_row(model, figures, recent, view) for model in page], "page": page, "list_form": form, "list_options": options,
            "filtered": any(options[key] for key in ("q", "tag", "owner")), "any_models": RegisteredModel.objects.exists(),
            "create_form": forms.ModelCreateForm()}


def _model_row(model: RegisteredModel, figures: dict, recent: dict, view: fleet.FleetView) -> dict:
    release = model.current_release()
    convergence = fleet.convergence(release, view)
    level, words = model_health(model, release, convergence, recent)
    return {
        "model": model, "release": release, "segments": split_segments(release), "canary": canary_route(release),
        "convergence": convergence, "figures": model_figures(figures, model.name), "health_level": level, "health": words,
        "versions_count": len(model.versions.all()),
    }


def model_health(model: RegisteredModel, release: Release | None, convergence: dict, recent: dict) -> tuple[str, str]:
    mine = {number: traffic for (name, number), traffic in recent.items() if name == model.name}
    return health(release, convergence, mine, running_verdict(model))


def running_verdict(model: RegisteredModel) -> RolloutVerdict | None:
    """The newest verdict of the model's rollout while the analysis runs it."""
    rollout = model.rollouts.filter(status__in=ANALYSED_ROLLOUT_STATUSES).first()
    return rollout.verdicts.select_related("rollout").first() if rollout else None


# ---------------------------------------------------------------- model page

MODEL_FRAGMENTS = {
    "release-panel": "console/fragments/release_panel.html",
    "rollout-panel": "console/fragments/rollout_panel.html",
    "health": "console/fragments/health_pill.html",
    "live-figures": "console/fragments/live_figures.html",
    "versions-table": "console/fragments/versions_table.html",
    "audit": "console/fragments/audit.html",
    "drills": "console/fragments/model_drills.html",
    "evaluation-table": "console/fragments/evaluation_table.html",
}


@login_required
def model_page(request, name: str):
    model = _model(name)
    try:
        chosen, refusal = audit_log.AuditFilter.parse(request.GET), ""
    except audit_log.AuditFilterError as error:
        chosen, refusal = audit_log.NO_FILTER, error.message
    response = _page(request, "console/model.html", {**model_context(model, chosen), **audit_filter_context(model, chosen, refusal)}, MODEL_FRAGMENTS)
    if refusal:
        response.status_code = 400
    return response


def model_context(model: RegisteredModel, chosen: audit_log.AuditFilter = audit_log.NO_FILTER) -> dict:
    release = model.current_release()
    figures = live_figures(list(fleet.live_workers()))
    roles = version_roles(release)
    versions = list(model.versions.select_related("uploaded_by"))
    panel = _release_panel_context(model, release, versions)
    level, words = model_health(model, release, panel["convergence"], recent_traffic(model.name))
    served = _served(model)
    running = measuring(model)
    return {
        "nav": "models",
        "model": model,
        "release": release,
        **panel,
        **rollout_panel_context(model, release, versions),
        "health_level": level,
        "health": words,
        "versions": [{"version": version, "role": roles.get(version.number, ""), "served": served.get(version.number), "headline": headline(version.metrics),
                      "measuring": running.get(version.number, []), "store_changed": _store_changed(version)} for version in versions],
        "evaluation": evaluation_context(model),
        "live_rows": _live_rows(model, roles, figures),
        "audit_entries": audit_entries(model, chosen),
        "drills": model.drills.select_related("model", "actor")[:5],
        "upload_form": forms.UploadForm(),
        "details_form": forms.ModelDetailsForm(initial={"description": model.description, "tags": model.tags, "owner": model.owner.get_username() if model.owner else ""}),
        "live_config": {"model": model.name, "gone_after_s": settings.WORKER_GONE_AFTER_S, "drill_silent_s": drills.RECENTLY_SILENT_S,
                        "workers": _drill_participants()},
    }


def _drill_participants() -> list[dict]:
    """The workers a drill started now would wait for, as the page's first reports: a worker
    frozen before the page loaded sends it nothing, and the drill's progress left it out
    ("1 of 1 worker" while the drill waited for two)."""
    now = timezone.now()
    workers, _, _ = drills.drill_workers(now)
    return [{"worker": worker.worker_id, "generation": worker.generation, "seen_s_ago": max(0.0, (now - worker.last_seen_at).total_seconds())}
            for worker in workers]


def _store_changed(version: ModelVersion) -> bool:
    """Its stored file no longer has the bytes uploaded, as this console last streamed it
    (``served_bytes``): the version read "Ready" while any worker that loaded it afresh
    refused it, and workers that had it cached served it on (an operator's fault run)."""
    return version.status == VersionStatus.READY and served_bytes.known_mismatch(storage.path_for(version.sha256))


def _release_panel_context(model: RegisteredModel, release: Release | None, versions: list[ModelVersion]) -> dict:
    archived = release is not None and release.is_archive
    # An archive release keeps the routes it replaced as what a restore brings back; no rollback goes there,
    # and none is offered that would be refused (releases.rollback_refusal says why instead).
    refusal = releases.rollback_refusal(release) if release and not archived else None
    target = release.rollback_target if release and not archived and not refusal else None
    canary = canary_route(release)
    choices = canary_choices(release, versions)
    return {
        "segments": split_segments(release),
        "current_summary": describe_routes(release.routes) if release else "",
        "canary": canary,
        "weighted_canaries": (canaries := weighted_canaries(release)),
        "current_canaries": describe_routes(canaries),
        "running_rollout": model.rollouts.filter(status__in=ANALYSED_ROLLOUT_STATUSES).first(),
        "rollback_target": target,
        "rollback_refusal": refusal,
        "abort_ended_chain": releases.abort_ended_chain(release) if release and not archived and target is None else None,
        "rollback_summary": describe_routes(target.routes) if target else "",
        "archive_restores": describe_routes(release.rollback_target.routes) if archived and release.rollback_target else "",
        "rollback_preview": releases.describe_rollback_target(target) if target else None,
        "promote_returns_to": _promote_returns_to(model, release) if canary else "",
        "active_rollout": model.rollouts.filter(status__in=ACTIVE_ROLLOUT_STATUSES).first(),
        "convergence": (convergence := fleet.convergence(release)),
        # The promote dialog shows it, with a Force control: promoted, no worker would serve it.
        "canary_load_failure": fleet.load_failure(model.name, canary["version"]) if canary else None,
        "lagging_workers": (lagging := [row for row in convergence["workers"] if not row["converged"]]),
        # "Converging" of a worker whose apply failed read as if it would get there by itself.
        "lagging_failed": any(row["error"] and not row["ok"] for row in lagging) or bool(convergence["unconfirmed_silent"]),
        "split_form": _split_form(release, choices, canary),
        "split_candidates": (candidates := canary_candidates(versions, choices, model, release)),
        "canary_worse": next((candidate["worse"] for candidate in candidates if canary and candidate["number"] == canary["version"]), []),
        "split_any_incompatible": any(candidate["incompatible"] for candidate in candidates),
        "split_any_unloadable": any(candidate["load_failure"] for candidate in candidates),
        "presets": forms.PRESET_WEIGHTS,
        "full_weight": forms.FULL_WEIGHT,
        "last_drill": model.drills.select_related("actor").first(),
        "drill_silent": (silent := drills.silent_participants() if target else ([], 0))[0],
        "drill_silent_more": silent[1],
    }


def _promote_returns_to(model: RegisteredModel, release: Release) -> str:
    """What a rollback after promoting now would return to (``releases.promote``' rule)."""
    target = releases.promote_returns_to(model, release)
    return f"{describe_routes(target.routes)} (generation {target.generation})"


def _served(model: RegisteredModel) -> dict[int, dict]:
    rows = (VersionMetricMinute.objects.filter(version__model=model, minute__gte=timezone.now() - SERVED_WINDOW).values("version__number")
            .annotate(requests=Sum("requests"), errors=Sum("errors"), client_errors=Sum("client_errors")))
    return served_since(rows)


def audit_filter_context(model: RegisteredModel, chosen: audit_log.AuditFilter, refusal: str) -> dict:
    """The audit panel's filter form and its CSV link, which carries the same filters."""
    export = reverse("api-audit", kwargs={"name": model.name}) + "?" + urlencode({**chosen.as_query(), "format": "csv"})
    return {"audit_filter": chosen, "audit_filter_error": refusal, "audit_kinds": AuditKind.choices, "audit_actors": audit_log.actors(model),
            "audit_csv_url": export}


def audit_entries(model: RegisteredModel, chosen: audit_log.AuditFilter = audit_log.NO_FILTER) -> list[dict]:
    """The newest audit events (of ``chosen``), each with the generation in force when it
    happened, the one a release event made, and the reason typed with the action."""
    events = list(audit_log.events(model, chosen)[:AUDIT_EVENTS_SHOWN])
    if not events:
        return []
    # By id, newest first: their times nearly always follow, but two transactions may commit out of time order.
    oldest, newest = min(event.created_at for event in events), max(event.created_at for event in events)
    timeline = list(model.releases.filter(created_at__gte=oldest, created_at__lte=newest).order_by("generation").values_list("created_at", "generation"))
    before = model.releases.filter(created_at__lt=oldest).order_by("-generation").values_list("created_at", "generation").first()
    in_force = releases_in_force([event.created_at for event in events], ([before] if before else []) + timeline)
    return [
        {"event": event, "generation": audit_log.generation_made(event) or generation, "made": audit_log.generation_made(event),
         "reason": audit_log.reason(event), "rollout": event.data.get("rollout")}
        for event, generation in zip(events, in_force, strict=True)
    ]


def rollout_panel_context(model: RegisteredModel, release: Release | None, versions: list[ModelVersion], shown: Rollout | None = None) -> dict:
    """The rollout shown (the model's newest, or ``shown``), its last verdict, the
    history, and the form that starts one."""
    history = list(model.rollouts.select_related("actor")[:ROLLOUTS_SHOWN])
    rollout = shown or (history[0] if history else None)
    verdict = rollout.verdicts.first() if rollout else None
    choices = canary_choices(release, versions)
    candidates = canary_candidates(versions, choices, model, release)
    return {
        "rollout": rollout,
        "rollout_is_active": rollout is not None and rollout.status in ACTIVE_ROLLOUT_STATUSES,
        "rollout_abort_target": rollouts.abort_target(rollout, release) if rollout is not None else None,
        "current_summary": describe_routes(release.routes) if release else "",  # the abort dialog's "Now:", on the rollout page too
        "rollout_is_analysed": rollout is not None and rollout.status in ANALYSED_ROLLOUT_STATUSES,
        "rollout_overdue_s": rollouts.analysis_overdue_s(rollout) if rollout else None,
        "rollout_waits_for_reports": rollouts.waits_for_reports(rollout) if rollout else False,
        # A paused rollout whose traffic someone changed since: its step is not what serves.
        "rollout_traffic_elsewhere": (f"{describe_routes(release.routes)} (generation {release.generation})"
                                      if rollout is not None and rollout.status in ACTIVE_ROLLOUT_STATUSES and release is not None
                                      and release.generation != rollout.release_generation else ""),
        "rollout_steps": rollout_steps(rollout) if rollout else [],
        "rollout_hold": duration_words(rollout.step_duration_s) if rollout else "",
        "rollout_state": rollout_state_key(rollout) if rollout else "",
        "rollout_verdict": verdict,
        "signal_rows": signal_rows(verdict),
        "rollout_history": history,
        "any_rollout_active": any(item.status in ACTIVE_ROLLOUT_STATUSES for item in history),
        "rollout_form": forms.RolloutForm(initial={"canary_version": max(choices) if choices else None, "plan": "standard"}, canary_choices=choices),
        "rollout_candidates": candidates,
        "rollout_any_incompatible": any(candidate["incompatible"] or candidate["load_failure"] for candidate in candidates),
        "rollout_analysis": _analysis_or_none(model),
    }


def canary_candidates(versions: list[ModelVersion], choices: list[int], model: RegisteredModel, release: Release | None) -> list[dict]:
    """Each version a canary (a split's or a rollout's) may be, newest first, how its
    inputs differ from the current stable's (as the change's own check judges them, not the
    upload's report: that named the stable of the day, and once another was promoted the
    form offered no Force for a split the console refused without it), why no live
    worker serves it when they say they failed to load it (a split is refused then, unless
    forced), and where it scored worse than the stable version (the 100% dialog says so)."""
    by_number = {version.number: version for version in versions}
    stable = by_number.get(release.stable_version) if release else None
    datasets = list(model.datasets.all()) if stable and choices else []
    candidates, workers = [], fleet.live_workers_brief()
    for number in sorted(choices, reverse=True):
        differences = input_differences(stable.signature, by_number[number].signature, stable_version=stable.number) if stable else []
        candidates.append({"number": number, "incompatible": bool(differences), "differences": differences,
                           "stable_version": stable.number if stable else None,
                           "load_failure": releases.loadable_problem(model, number, workers, by_number[number]),
                           "worse": version_metrics.evaluation_regressions(by_number[number], stable, datasets) if stable else []})
    return candidates


def _analysis_or_none(model: RegisteredModel):
    try:
        return rollouts.resolve_analysis(model, {})
    except rollouts.RolloutError:
        return None  # the start answers with the reason


def canary_choices(release: Release | None, versions) -> list[int]:
    """Ready versions other than the stable one: what a canary may be."""
    stable = release.stable_version if release else None
    return [version.number for version in versions if version.status == VersionStatus.READY and version.number != stable]


def _split_form(release: Release | None, choices: list[int], canary: dict | None) -> forms.SplitForm:
    chosen = canary["version"] if canary else (max(choices) if choices else None)
    initial = {"canary_version": chosen, "weight": canary["weight"] if canary else None}
    return forms.SplitForm(initial=initial, canary_choices=choices, stable_version=release.stable_version if release else None)


def _live_rows(model: RegisteredModel, roles: dict[int, str], figures: dict) -> list[dict]:
    """Versions that serve or could: routed, warm, or seen in a live report."""
    numbers = set(roles) | {version for (name, version), _ in figures.items() if name == model.name}
    order = {"stable": 0, "canary": 1, "shadow": 2, "warm": 3}
    ordered = sorted(numbers, key=lambda number: (order.get(roles.get(number, ""), 4), -number))
    return [{"version": number, "role": roles.get(number, ""), "figures": figures.get((model.name, number))} for number in ordered]


# ---------------------------------------------------------------- traffic actions


@require_POST
@operator_required
def set_split(request, name: str):
    model = _model(name)
    release = model.current_release()
    stale = _stale_form(model, release, request.POST.get("expected_generation"))
    if stale is not None:  # before the fields: a version promoted meanwhile was "not one of the available choices"
        return _answer(request, name, "error", stale.message, status=stale.status, **stale.details())
    choices = canary_choices(release, model.versions.all())
    form = forms.SplitForm(request.POST, canary_choices=choices, stable_version=release.stable_version if release else None,
                           live_canaries=weighted_canaries(release))
    if not form.is_valid():
        return _answer(request, name, "error", _first_error(form), status=400)
    if form.cleaned_data["needs_confirmation"]:
        return _confirm_full_share(request, model, form.cleaned_data)
    if form.cleaned_data["needs_replace_confirmation"]:
        return _confirm_replace(request, model, form.cleaned_data)
    seen = form.cleaned_data["expected_generation"]
    data = form.cleaned_data
    return _release(request, model, lambda: releases.set_routes(model, form.routes(), request.user, data["reason"], expected_generation=seen,
                                                                force=data["force"]))


@require_http_methods(["GET", "POST"])
@operator_required
def promote(request, name: str):
    model = _model(name)
    if request.method == "GET":
        return _confirm(request, model, "console/fragments/confirm_promote.html")
    form = forms.PromoteForm(request.POST)
    if not form.is_valid():
        return _answer(request, name, "error", _first_error(form), status=400)
    reason, seen, force = form.cleaned_data["reason"], form.cleaned_data["expected_generation"], form.cleaned_data["force"]
    return _release(request, model, lambda: releases.promote(model, request.user, reason, expected_generation=seen, force=force))


@require_http_methods(["GET", "POST"])
@operator_required
def rollback(request, name: str):
    model = _model(name)
    if request.method == "GET":
        return _confirm(request, model, "console/fragments/confirm_rollback.html")
    form = forms.ReasonForm(request.POST)
    if not form.is_valid():
        return _answer(request, name, "error", _first_error(form), status=400)
    reason, seen = form.cleaned_data["reason"], form.cleaned_data["expected_generation"]
    return _release(request, model, lambda: releases.rollback(model, request.user, reason, expected_generation=seen))


def release_error_words(error: releases.ReleaseError) -> str:
    """A refusal as the console says it: an unforced incompatible canary names the page's
    Force control, not the API's ``force: true``."""
    if isinstance(error, releases.IncompatibleInputs):
        return f"{error.refusal}: tick Force and say why in the reason to route traffic to it anyway"
    if isinstance(error, releases.CanaryNotLoaded):
        return f"{error.refusal}. Mend or replace the version, or tick Force and say why in the reason to do it anyway"
    return error.message


def _release(request, model: RegisteredModel, change):
    running = list(model.rollouts.filter(status__in=ANALYSED_ROLLOUT_STATUSES).values_list("pk", flat=True))
    try:
        with committing(request):
            release = change()
    except releases.ReleaseError as error:
        return _answer(request, model.name, "error", release_error_words(error), status=error.status, **error.details())
    # A change of one's own pauses a running rollout; the answer said only the new split.
    paused = list(model.rollouts.filter(pk__in=running, status=RolloutStatus.PAUSED).values_list("pk", flat=True))
    return _release_made(request, model, release, paused=paused)


def _release_made(request, model: RegisteredModel, release: Release, *, paused: list[int] = ()):
    text = f"Generation {release.generation}: traffic is now {describe_routes(release.routes)}. Workers are converging."
    text += "".join(f" Rollout #{pk} is paused by this change: resume it to go on, or abort it." for pk in paused)
    return _answer(request, model.name, "success", text, generation=release.generation)


def _confirm_full_share(request, model: RegisteredModel, data: dict):
    """100% makes the canary the only route: asked again, as a promote is."""
    version = data["canary_version"]
    if _wants_json(request):
        text = f"v{version} at {forms.FULL_WEIGHT}% takes all the traffic of {model.name}: confirm it with the {forms.FULL_WEIGHT}% button's dialog"
        return _answer(request, model.name, "error", text, status=400)
    return _confirm(request, model, "console/fragments/confirm_full_share.html",
                    full_share={"version": version, "reason": data["reason"], "force": data["force"], "replaced": describe_routes(data["replaces"])})


def _confirm_replace(request, model: RegisteredModel, data: dict):
    """Another version in the live canary's place takes that canary out of traffic: asked first."""
    replaced = describe_routes(data["replaces"])
    version, weight = data["canary_version"], data["canary_weight"]
    if _wants_json(request):
        text = f"v{version} at {weight}% takes the place of the canary {replaced}: confirm it in the replacement dialog"
        return _answer(request, model.name, "error", text, status=400)
    return _confirm(request, model, "console/fragments/confirm_replace_canary.html",
                    replace={"version": version, "weight": weight, "replaced": replaced, "reason": data["reason"], "force": data["force"]})


def _stale_form(model: RegisteredModel, release: Release | None, seen: str | None) -> releases.GenerationConflict | None:
    """The refusal of a form made on an older generation, or None (the registry checks
    it again under its lock; a form without the field is refused by the form)."""
    if not (seen and seen.isascii() and seen.isdigit()):
        return None
    try:
        releases.check_expected_generation(model, release, int(seen))
    except releases.GenerationConflict as error:
        return error
    return None


def _confirm(request, model: RegisteredModel, fragment: str, **extra):
    """The confirmation a dialog shows, as a page of its own for browsers without JS."""
    release = model.current_release()
    context = {"nav": "models", "model": model, "release": release, "confirm_fragment": fragment, "standalone": True, **extra}
    context.update(_release_panel_context(model, release, list(model.versions.all())))
    return render(request, "console/confirm.html", context)


@require_http_methods(["GET", "POST"])
@operator_required
def to_stable(request, name: str):
    """Everything back on the stable version at once (``rollouts.back_to_stable``)."""
    model = _model(name)
    if request.method == "GET":
        return _confirm(request, model, "console/fragments/confirm_to_stable.html")
    form = forms.ToStableForm(request.POST)
    if not form.is_valid():
        return _answer(request, name, "error", _first_error(form), status=400)
    reason, seen = form.cleaned_data["reason"], form.cleaned_data["expected_generation"]
    try:
        release, aborted = rollouts.back_to_stable(model, request.user, reason, expected_generation=seen,
                                                   promised_version=form.cleaned_data["promised_version"])
    except releases.ReleaseError as error:
        return _answer(request, model.name, "error", error.message, status=error.status, **error.details())
    return _aborted_answer(request, model, aborted, release) if aborted is not None else _release_made(request, model, release)


def abort_rollout_answer(request, model: RegisteredModel, rollout: Rollout, reason: str, promised):
    before = rollout.release_generation
    try:
        rollout = rollouts.abort(rollout, request.user, reason, promised_target=promised)
    except releases.ReleaseError as error:
        return _answer(request, model.name, "error", error.message, status=error.status, **error.details())
    return _aborted_answer(request, model, rollout, rollouts.abort_release(before, rollout))


def _aborted_answer(request, model: RegisteredModel, rollout: Rollout, made: Release | None):
    """What the abort did: the release it made, or the traffic it left as it was (a change
    made since the rollout's last step, which the abort keeps)."""
    if made is None:
        current = model.current_release()
        text = f"Rollout #{rollout.pk} aborted; the traffic stays as it was ({describe_routes(current.routes) if current else 'nothing routed'})."
        return _answer(request, model.name, "success", text, rollout=rollout.pk, generation=current.generation if current else None)
    text = f"Rollout #{rollout.pk} aborted: v{made.stable_version} is back to 100% (generation {made.generation}). Workers are converging."
    return _answer(request, model.name, "success", text, rollout=rollout.pk, generation=made.generation)


@login_required
def release_page(request, name: str, generation: int):
    """One release as it was: its split, who made it and why, what it replaced and what
    replaced it; the audit timeline links here for the release in force at each event."""
    return render(request, "console/release.html", release_context(_model(name), generation))


def release_context(model: RegisteredModel, generation: int) -> dict:
    shown = get_object_or_404(model.releases.select_related("actor", "rollback_target"), generation=generation)
    current = model.current_release()
    return {
        "nav": "models", "model": model, "shown": shown, "segments": split_segments(shown),
        "summary": "nothing (archived: no worker serves the model)" if shown.is_archive else describe_routes(shown.routes),
        "previous": model.releases.filter(generation__lt=generation).order_by("-generation").first(),
        "following": model.releases.filter(generation__gt=generation).order_by("generation").first(),
        "events": model.audit_events.filter(data__generation=generation).select_related("actor")[:AUDIT_EVENTS_SHOWN],
        "api_url": reverse("api-release", kwargs={"name": model.name}) + "?" + urlencode({"at": shown.created_at.isoformat()}),
        "current": current, "current_summary": describe_routes(current.routes) if current else "nothing",
        "restore_refusal": releases.restore_refusal(model, shown),
        "restore_unloadable": releases.restore_unloadable(model, shown),
    }


@require_http_methods(["GET", "POST"])
@operator_required
def restore(request, name: str, generation: int):
    """An earlier generation's split, again, in a new generation (``releases.restore``):
    what the rollback's refusal sends the operator to do from the history."""
    model = _model(name)
    if request.method == "GET":
        return render(request, "console/confirm.html", {**release_context(model, generation), "standalone": True,
                                                        "confirm_fragment": "console/fragments/confirm_restore.html"})
    form = forms.RestoreForm(request.POST)
    if not form.is_valid():
        return _answer(request, name, "error", _first_error(form), status=400)
    reason, seen, force = form.cleaned_data["reason"], form.cleaned_data["expected_generation"], form.cleaned_data["force"]
    return _release(request, model, lambda: releases.restore(model, generation, request.user, reason, expected_generation=seen, force=force))


@require_http_methods(["GET", "POST"])
@operator_required
def drill(request, name: str):
    model = _model(name)
    if request.method == "GET":
        return _confirm(request, model, "console/fragments/confirm_drill.html")
    form = forms.DrillForm(request.POST)
    if not form.is_valid():
        return _answer(request, name, "error", f"Drill not run: {_first_error(form)}", status=400)
    try:
        # An outage once the rollback is committed answers that it was made, not "retry".
        with committing(request):
            result = drills.run_drill(model, request.user, roll_forward=form.cleaned_data["roll_forward"],
                                      expected_generation=form.cleaned_data["expected_generation"],
                                      made=lambda change: mark_committed(request, change))
    except releases.ReleaseError as error:
        return _answer(request, name, "error", f"Drill not run: {error.message}", status=error.status, **error.details())
    mark_committed(request, f"{name}: {_drill_words(result)}")  # a failed drill ran too, and may have changed traffic
    level = "success" if result.status == DrillStatus.PASSED else "error"
    return _answer(request, name, level, _drill_words(result), drill=result.pk, status_name=result.status)


def _drill_words(result: Drill) -> str:
    """The drill's own summary: its reasons when it has any ("no ack from every worker"
    read as if none had acked, and hid which one did not, and why)."""
    outcome = f"Drill #{result.pk} {result.get_status_display().lower()}"
    passed = result.status == DrillStatus.PASSED
    if result.error and not passed:
        return f"{outcome}: {result.error}."
    last_ack = "no worker acked" if result.last_ack_s is None else f"last ack after {result.last_ack_s:.3f} s"
    failed = "failed requests not counted" if result.failed_requests is None else f"{result.failed_requests} failed requests"
    # A passed drill's notes come after its figures: "passed: not measured: 1 worker gone"
    # read as a contradiction to a tired operator.
    noted = f" Noted: {result.error}." if result.error else ""
    return f"{outcome}: {last_ack}, {failed}.{noted}"


# ---------------------------------------------------------------- upload


@csrf_exempt  # the middleware's check would parse (and stage) the body: checked below
@require_POST
@operator_required
def upload_version(request, name: str):
    """The body is parsed only after the role check. CSRF: a script's ``X-CSRFToken`` is
    checked before the body is read; a plain form's token can only be read by parsing,
    which for a signed-in operator stages the file for the length of this request."""
    model = _model(name)
    token_in_header = settings.CSRF_HEADER_NAME in request.META
    if token_in_header:
        _refuse_forgery(csrf_failure_from_headers(request))
    if declared_too_large(request):
        # Recorded only once the request is known to come from the page (its CSRF header):
        # a plain form's token lies in the body, unread here, and another site's forged
        # form must not write the operator's name into the audit.
        refusal = uploads.refuse_too_large(model, request.user) if token_in_header else storage.UploadTooLarge(settings.MAX_UPLOAD_BYTES)
        return _answer(request, name, "error", str(refusal), status=413)
    staging = start_staging(request)
    try:
        if not token_in_header:
            _refuse_forgery(csrf_failure(request))
        return _upload(request, model)
    except OSError as error:
        refusal = storage.write_refusal(error)
        if refusal is None:
            raise
        logger.error("the artifact store could not keep an upload to %s: %s", name, error)
        return _answer(request, name, "error", f"Upload refused: {refusal[1]}", status=refusal[0])
    finally:
        staging.discard()  # whatever happened: registered bytes have moved into the store


def _refuse_forgery(reason: str | None) -> None:
    if reason:
        raise PermissionDenied(f"CSRF check failed: {reason}")


UPLOAD_COPY_LABEL = "Upload as a copy"  # the upload form's checkbox (templates/console/fragments/upload_form.html)


def _upload(request, model: RegisteredModel):
    name = model.name
    if getattr(request, "upload_too_large", False):  # the CSRF check has passed: recorded
        return _answer(request, name, "error", str(uploads.refuse_too_large(model, request.user)), status=413)
    form = forms.UploadForm(request.POST, request.FILES)
    if not form.is_valid() or not isinstance(form.cleaned_data["artifact"], StagedUploadedFile):
        return _answer(request, name, "error", "choose an .onnx file to upload" if form.is_valid() else _first_error(form), status=400)
    try:
        version, job = uploads.accept_staged(model, form.cleaned_data["artifact"].staged, uploaded_by=request.user, description=form.cleaned_data["description"],
                                             allow_duplicate=form.cleaned_data["allow_duplicate"])
    except uploads.DuplicateUpload as refusal:
        text = f"Upload refused: {refusal.identical}; tick “{UPLOAD_COPY_LABEL}” and upload it again to register it as a new version anyway"
        return _answer(request, name, "error", text, status=409, **duplicate_details(refusal.existing))
    except uploads.UploadRefused as refusal:
        return _answer(request, name, "error", f"Upload refused: {refusal.reason}", status=refusal.status)
    text = f"Version {version.number} uploaded; it is being validated (job #{job.pk}): the versions table shows whether it is ready or rejected."
    return _answer(request, name, "success", text, version=version.number, job=job.pk, status=202)


# ---------------------------------------------------------------- version page


VERSION_FRAGMENTS = {"benchmark": "console/fragments/benchmark.html", "evaluation": "console/fragments/evaluation_details.html"}


@login_required
def version_page(request, name: str, number: int):
    version = _version(name, number)
    return _page(request, "console/version.html", version_context(version), VERSION_FRAGMENTS)


def _version(name: str, number: int) -> ModelVersion:
    return get_object_or_404(ModelVersion.objects.select_related("model", "uploaded_by"), model__name=name, number=number)


def version_context(version: ModelVersion, **extra) -> dict:
    report = dict(version.validation_report or {})
    checks = report.pop("checks", [])
    since = timezone.now() - ROLLUP_WINDOW
    rollup = [
        {"t": row.minute.timestamp(), "requests": row.requests, "errors": row.errors, "client_errors": row.client_errors, "latency_sum_s": row.latency_sum_s,
         "latency_buckets": row.latency_buckets, "batch_size_buckets": row.batch_size_buckets}
        for row in version.metric_minutes.filter(minute__gte=since)
    ]
    release = version.model.current_release()
    context = {
        "nav": "models", "model": version.model, "version": version, "version_role": version_roles(release).get(version.number, ""),
        "signature": version.signature or {}, "checks": checks, "report_facts": report, "rollup": rollup,
        "served": _served(version.model).get(version.number),
        "download_url": reverse("api-version-artifact", kwargs={"name": version.model.name, "number": version.number}),
        "try_form": forms.TryForm(initial={"inputs": example_inputs(version.signature or {})}),
        "version_form": forms.VersionDetailsForm(initial={"description": version.description}),
        "worker_url": serving_url(),
        "takes_traffic": bool(release) and any(route["version"] == version.number and route["weight"] > 0 for route in release.routes),
        "jobs_config": {"model": version.model.name, "page": "version", "version": version.number},
        **version_metrics_context(version, release.stable_version if release else None),
    }
    context.update(extra)
    return context


def example_inputs(signature: dict) -> str:
    """A request body to start from: one row of zeros shaped like each input."""
    inputs = signature.get("inputs") or []
    rows = {spec["name"]: _zeros(spec) for spec in inputs}
    value = next(iter(rows.values())) if len(rows) == 1 else rows
    return json.dumps(value)


def _zeros(spec: dict):
    shape = list(spec.get("shape") or [])
    if shape and not isinstance(shape[0], int):
        shape = shape[1:]  # the batch dimension: /predict takes a single row without it
    fill = {"BOOL": False, "BYTES": ""}.get(spec.get("datatype"), 0)
    value = fill
    for size in reversed(shape):
        value = [value] * (size if isinstance(size, int) and size > 0 else 1)
    return value


def serving_url() -> str:
    """The configured serving URL, never one a worker reported: anyone holding the worker
    token could report any URL and have the console post to an internal host."""
    return settings.SERVING_PUBLIC_URL.rstrip("/")


@require_POST
@login_required
def try_version(request, name: str, number: int):
    """Reading a prediction changes nothing, so every signed-in role may try."""
    version = _version(name, number)
    form = forms.TryForm(request.POST)
    result = ask_worker(version, form.cleaned_data["inputs"]) if form.is_valid() else {"ok": False, "error": _first_error(form)}
    if _wants_json(request):
        html = render_to_string("console/fragments/try_result.html", {"result": result}, request=request)
        return JsonResponse({**result, "html": html})
    return render(request, "console/version.html", version_context(version, try_form=form, try_result=result))


def ask_worker(version: ModelVersion, inputs) -> dict:
    """POST {worker}/predict on the console's side, so the browser needs no CORS."""
    url = serving_url()
    body = {"model_name": version.model.name, "version": version.number, "inputs": inputs}
    started = time.monotonic()
    try:
        with httpx.stream("POST", f"{url}/predict", json=body, timeout=TRY_TIMEOUT_S) as response:
            content = _read_at_most(response, TRY_ANSWER_MAX_BYTES, started + TRY_TIMEOUT_S)
    except httpx.HTTPError as error:
        return {"ok": False, "worker_url": url, "error": f"no answer from the worker at {url}: {error}"}
    except _TryAnswerRefused as refusal:
        return {"ok": False, "worker_url": url, "error": str(refusal)}
    try:
        answer = json.loads(content)
    except ValueError:
        answer = {"error": content[:500].decode(errors="replace")}
    round_trip_ms = round((time.monotonic() - started) * 1000, 1)
    return {"ok": response.status_code == 200, "status": response.status_code, "worker_url": url, "round_trip_ms": round_trip_ms, "answer": answer}


class _TryAnswerRefused(Exception):
    """A worker's answer the form stops reading; the message says why."""


def _read_at_most(response: httpx.Response, max_bytes: int, deadline: float) -> bytes:
    """The body, refused as soon as it passes ``max_bytes`` or ``deadline`` (monotonic; the
    rest is never read). httpx's timeout bounds each read, not the answer: a worker sending
    a byte every 9 s held the console's thread, and its changes slot, for as long as it liked."""
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise _TryAnswerRefused(f"the worker's answer is larger than this form shows ({max_bytes:,} bytes): "
                                    "ask the worker's /predict or /v2 API for it")
        if time.monotonic() > deadline:
            raise _TryAnswerRefused(f"the worker's answer took longer than this form waits ({TRY_TIMEOUT_S:g} s) to arrive")
        chunks.append(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------- workers and drills


@login_required
def workers_page(request):
    return _page(request, "console/workers.html", {"nav": "workers", **workers_context()}, {"workers-table": "console/fragments/workers_table.html"})


def workers_context() -> dict:
    now = timezone.now()
    generation = current_generation()
    digests = fleet.IssuedDigests()
    rows = []
    for worker in Worker.objects.filter(last_seen_at__gte=now - WORKERS_SHOWN_FOR):
        state = fleet.convergence_state(worker, generation, digests, now)  # as /metrics counts it
        rows.append({"worker": worker, "lifecycle": fleet.lifecycle(worker, now), "is_live": state not in ("gone", "stopped"),
                     "is_failing": state == "failing", "is_behind": state == "behind", "digest": fleet.served_digest(worker, digests),
                     **loaded_shown(worker), **report_totals(worker.last_report)})
    rows.sort(key=lambda row: (not row["is_live"], row["worker"].worker_id))
    return {"rows": rows, "generation": generation, "gone_after_s": settings.WORKER_GONE_AFTER_S}


def loaded_shown(worker: Worker) -> dict:
    """The first LOADED_SHOWN of the worker's loaded versions, and how many more it has."""
    loaded = worker.loaded if isinstance(worker.loaded, list) else []
    return {"loaded": loaded[:LOADED_SHOWN], "loaded_more": max(len(loaded) - LOADED_SHOWN, 0)}


@login_required
def drills_page(request):
    context = {"nav": "drills", "drills": Drill.objects.select_related("model", "actor")[:DRILLS_SHOWN], "show_model": True}
    return _page(request, "console/drills.html", context, {"drills-table": "console/fragments/drills_table.html"})
