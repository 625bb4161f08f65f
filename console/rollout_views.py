"""Rollout pages: start a rollout from the model page, pause, resume and abort it, and
one rollout's page. Page twins of ``registry/api/rollouts_views.py``: the rules live in
``registry.actions.rollouts``; these views parse the form, call, and say what happened
(a message and a redirect, or JSON for the page's script)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_http_methods, require_POST

from console import forms
from console.views import (
    MODEL_FRAGMENTS,
    _answer,
    _confirm,
    _first_error,
    _model,
    _page,
    abort_rollout_answer,
    canary_choices,
    operator_required,
    release_error_words,
    rollout_panel_context,
)
from registry.actions import releases, rollouts
from registry.models import RegisteredModel, Rollout


def _rollout(model: RegisteredModel, pk: int) -> Rollout:
    return get_object_or_404(model.rollouts.select_related("model", "actor"), pk=pk)


@require_POST
@operator_required
def start_rollout(request, name: str):
    model = _model(name)
    form = forms.RolloutForm(request.POST, canary_choices=canary_choices(model.current_release(), model.versions.all()))
    if not form.is_valid():
        return _answer(request, name, "error", f"Rollout not started: {_first_error(form)}", status=400)
    data = form.cleaned_data
    try:
        rollout = rollouts.start(model, data["canary_version"], data["plan_steps"], data["step_duration_s"], {}, request.user, data["reason"],
                                 expected_generation=data["expected_generation"], force=data["force"])
    except releases.ReleaseError as error:
        return _answer(request, name, "error", f"Rollout not started: {release_error_words(error)}", status=error.status, **error.details())
    interval_s = rollout.analysis["interval_s"]
    text = (f"Rollout #{rollout.pk} started: v{rollout.canary_version} at {rollout.current_weight}% (step 1 of {len(rollout.steps)}); "
            f"the analysis judges it every {interval_s:g} s.")
    return _answer(request, name, "success", text, rollout=rollout.pk, generation=rollout.release_generation)


def _rollout_action(action, done):
    """A POST view calling ``action(rollout, user, reason)`` and saying ``done(rollout)``."""

    @require_POST
    @operator_required
    def view(request, name: str, pk: int):
        model = _model(name)
        rollout = _rollout(model, pk)
        form = forms.RolloutActionForm(request.POST)
        if not form.is_valid():
            return _answer(request, name, "error", _first_error(form), status=400)
        try:
            rollout = action(rollout, request.user, form.cleaned_data["reason"], expected_generation=form.cleaned_data["expected_generation"])
        except releases.ReleaseError as error:
            return _answer(request, name, "error", error.message, status=error.status, **error.details())
        return _answer(request, name, "success", done(rollout), rollout=rollout.pk)

    return view


def _paused(rollout: Rollout) -> str:
    return (f"Rollout #{rollout.pk} paused at step {rollout.step_index + 1} of {len(rollout.steps)} (v{rollout.canary_version} at "
            f"{rollout.current_weight}%): no window is judged until it is resumed.")


def _resumed(rollout: Rollout) -> str:
    return (f"Rollout #{rollout.pk} resumed: v{rollout.canary_version} at {rollout.current_weight}% "
            f"(step {rollout.step_index + 1} of {len(rollout.steps)}), the step's hold starts over.")


pause_rollout = _rollout_action(rollouts.pause, _paused)
resume_rollout = _rollout_action(rollouts.resume, _resumed)


@require_http_methods(["GET", "POST"])
@operator_required
def abort_rollout(request, name: str, pk: int):
    """Stable back to 100% at once, after a confirmation."""
    model = _model(name)
    rollout = _rollout(model, pk)
    if request.method == "GET":
        return _confirm(request, model, "console/fragments/confirm_abort_rollout.html", rollout=rollout,
                        rollout_abort_target=rollouts.abort_target(rollout, model.current_release()))
    form = forms.RolloutActionForm(request.POST)
    if not form.is_valid():
        return _answer(request, name, "error", _first_error(form), status=400)
    return abort_rollout_answer(request, model, rollout, form.cleaned_data["reason"], form.promised_target())


@login_required
def rollout_page(request, name: str, pk: int):
    """One rollout: the model page's panel for it, its charts and every window judged."""
    model = _model(name)
    rollout = _rollout(model, pk)
    release = model.current_release()
    context = {"nav": "models", "model": model, "release": release, "on_rollout_page": True,
               **rollout_panel_context(model, release, list(model.versions.all()), shown=rollout),
               "verdicts": rollout.verdicts.all()}
    return _page(request, "console/rollout.html", context, {"rollout-panel": MODEL_FRAGMENTS["rollout-panel"]})
