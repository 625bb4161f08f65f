"""Rollouts: a canary walks a plan of steps (percent of traffic), each judged by the
canary analysis every ``interval_s``; a passing step holds ``step_duration_s`` and then
advances, the last step (100) promotes, and ``failure_limit`` consecutive failing windows
roll back to the stable version at 100 %.

A first step of 0 is a **shadow step** (a dark launch): the canary answers no client,
``shadow_fraction`` of stable's requests are mirrored to it, and the window judges its
mirrored runs (their failures, its output distribution, its agreement with stable).

Every traffic change goes through ``registry.actions.releases`` (so it is one locked,
gap-free, audited release like any other). The state lives in the ``Rollout`` row, which
every action locks: ``tick`` may run in several Celery processes at once, and a window is
judged once (``windows_judged`` numbers it; the verdict's number is unique per rollout).

Windows that are waiting for data neither reset nor extend a streak of failing windows:
they carry no evidence either way.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from itertools import pairwise

from django.conf import settings as django_settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from registry.actions import events, releases
from registry.db_unavailable import is_database_unavailable
from registry.domain.canary_analysis import (
    FAIL,
    WAITING_FOR_DATA,
    AnalysisSettings,
    InvalidAnalysis,
    Verdict,
    aggregate,
    judge,
)
from registry.domain.choices import (
    ACTIVE_ROLLOUT_STATUSES,
    ANALYSED_ROLLOUT_STATUSES,
    RolloutStatus,
)
from registry.domain.json_numbers import finite_or_null
from registry.domain.traffic import MIN_SHADOW_FRACTION, SHADOW_FRACTION_WORDS, Route, canary_split, percent, versions_receiving
from registry.fleet import samples
from registry.fleet.workers import SAID_STOPPED, load_failure
from registry.models import (
    RegisteredModel,
    Release,
    ReportSample,
    Rollout,
    RolloutVerdict,
    ServingGeneration,
    Worker,
)

logger = logging.getLogger(__name__)

MAX_STEPS = 20
REPORTS_BEHIND = "waiting for the workers' reports"  # the status of a due window whose reports have not reached its end
MAX_STEP_DURATION_S = 7 * 24 * 3600.0


class RolloutError(releases.ReleaseError):
    """A rollout request that cannot be carried out (400)."""


class RolloutConflict(releases.ReleaseConflict):
    """The rollout is not in a state that allows this (409)."""


# ---- starting ------------------------------------------------------------------------


def check_steps(steps: object) -> list[int]:
    """Percentages, strictly increasing, from 1 to 100, ending at 100 (the step that
    promotes); the first may be 0, a shadow step."""
    if not isinstance(steps, list) or not steps:
        raise RolloutError("steps must be a non-empty list of percentages, e.g. [1, 10, 50, 100]")
    if len(steps) > MAX_STEPS:
        raise RolloutError(f"steps has {len(steps)} entries, at most {MAX_STEPS} are allowed")
    for index, step in enumerate(steps):
        if isinstance(step, bool) or not isinstance(step, int) or not (0 if index == 0 else 1) <= step <= 100:
            words = "from 0 (a shadow step) to 100" if index == 0 else "from 1 to 100 (only the first step may be 0, a shadow step)"
            shown = repr(step) if len(repr(step)) <= 40 else repr(step)[:37] + "..."
            raise RolloutError(f"steps[{index}] (step {index + 1}) must be an integer percentage {words}, got {shown}")
    if any(later <= earlier for earlier, later in pairwise(steps)):
        raise RolloutError(f"steps must increase strictly, got {steps}")
    if steps[-1] != 100:
        raise RolloutError(f"the last step must be 100 (it promotes the canary), got {steps[-1]}")
    if len(steps) < 2:
        raise RolloutError("a rollout needs at least one analysed step below 100 before the promotion")
    return steps


def check_step_duration(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_STEP_DURATION_S:
        raise RolloutError(f"step_duration_s must be a number of seconds from 0 to {MAX_STEP_DURATION_S:.0f}")
    return float(value)


def check_shadow_fraction(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_SHADOW_FRACTION <= value <= 1:
        raise RolloutError(f"shadow_fraction must be {SHADOW_FRACTION_WORDS}")
    return float(value)


def resolve_analysis(model: RegisteredModel, requested: object) -> AnalysisSettings:
    """The documented defaults, then the model's own thresholds, then the request's."""
    try:
        base = AnalysisSettings.parse(model.analysis or {})
        return AnalysisSettings.parse(requested or {}, base)
    except InvalidAnalysis as error:
        raise RolloutError(str(error)) from None


def start(model: RegisteredModel, canary_version: int, steps: object, step_duration_s: object, analysis: object, actor,
          reason: str = "", *, expected_generation: int | None = None, force: bool = False, shadow_fraction: object = 1.0) -> Rollout:
    plan = check_steps(steps)
    duration_s = check_step_duration(step_duration_s)
    fraction = check_shadow_fraction(shadow_fraction)
    settings = resolve_analysis(model, analysis)
    with transaction.atomic():
        ServingGeneration.objects.lock()
        _refuse_second_rollout(model)
        current = releases.require_current(model)
        releases.check_expected_generation(model, current, expected_generation)
        releases.check_not_archived(model)
        if canary_version == current.stable_version:
            raise RolloutError(f"version {canary_version} is already the stable version of {model.name}")
        unloadable = _check_canary(model, current, canary_version, force, reason)
        _refuse_third_version(model, current, canary_version)
        worse = releases.evaluated_worse(model, current, [canary_version])
        now = timezone.now()
        rollout = Rollout.objects.create(
            model=model, canary_version=canary_version, stable_version=current.stable_version, steps=plan,
            step_duration_s=duration_s, shadow_fraction=fraction, analysis=settings.to_json(), step_started_at=now,
            next_window_at=now + timedelta(seconds=settings.interval_s), forced=force,
            actor=actor if actor is not None and actor.is_authenticated else None, reason=reason,
        )
        forced_words = f"; forced although {unloadable}" if unloadable else ""
        worse_words = "".join(f"; {line}" for line in worse)
        events.rollout_event(rollout, actor, f"Rollout #{rollout.pk} started: v{canary_version} over steps {plan} "
                             f"({duration_s:g} s each, windows of {settings.interval_s:g} s){forced_words}{worse_words}{_because(reason)}",
                             {"event": "started", "reason": reason, **({"forced": [unloadable]} if unloadable else {}),
                              **({"evaluated_worse": worse} if worse else {})})
        _apply_step(rollout, actor, reason, force=force)
    rollout.evaluated_worse = worse  # what the start was told, for its answer (not a column)
    return rollout


def _check_canary(model: RegisteredModel, current, canary_version: int, force: bool, reason: str) -> str | None:
    """Ready, with the stable's inputs, and loadable (``releases.check_loadable``: a rollout
    routed 99 % to a version whose stored file had changed, where a split was refused)
    unless forced: checked at the start, since a shadow step routes no traffic and the
    refusal would otherwise come at the next step. The steps after follow the analysis,
    which fails a canary no worker serves."""
    if not model.versions.ready().filter(number=canary_version).exists():
        raise RolloutError(releases.version_not_ready(model, canary_version))
    releases.check_compatible(model, current, [Route(version=canary_version, weight=1)], force, reason)
    return releases.check_loadable(model, canary_version, force, reason, verb="rolled out")  # why it is forced, for the audit


def _refuse_third_version(model: RegisteredModel, current, canary_version: int) -> None:
    """A rollout moves traffic between the stable version and its canary: its first step
    replaced the split, and a third version's weight was gone without a word (v1 50 / v3
    50 became v1 99 / v2 1)."""
    others = [route for route in current.routes if route["weight"] > 0 and route["version"] not in (current.stable_version, canary_version)]
    if others:
        weighted = ", ".join(f"v{route['version']} at {route['weight']}%" for route in others)
        raise RolloutConflict(f"{model.name} also routes {weighted} (generation {current.generation}): a rollout moves traffic between "
                              f"the stable v{current.stable_version} and v{canary_version} only; set the split to v{current.stable_version} "
                              "alone first (Abort to stable), or promote the other version, then start the rollout")


def _refuse_second_rollout(model: RegisteredModel) -> None:
    active = model.rollouts.filter(status__in=ACTIVE_ROLLOUT_STATUSES).first()
    if active is not None:
        raise RolloutConflict(f"rollout #{active.pk} of {model.name} (v{active.canary_version}) is {active.get_status_display().lower()}: "
                              "one rollout per model at a time; abort it first")


def _apply_step(rollout: Rollout, actor, reason: str = "", *, force: bool = False) -> None:
    weight = rollout.current_weight
    share = f"shadow at {percent(rollout.shadow_fraction)} of requests" if weight == 0 else f"at {weight}%"
    note = f"rollout #{rollout.pk} step {rollout.step_index + 1}/{len(rollout.steps)}: v{rollout.canary_version} {share}"
    routes = canary_split(rollout.stable_version, rollout.canary_version, weight)
    if weight == 0:
        routes.append(Route(version=rollout.canary_version, weight=0, shadow=rollout.shadow_fraction).to_json())
    release = releases.set_routes(rollout.model, routes, actor, f"{note}{_because(reason)}", force=force or rollout.forced, rollout=rollout)
    rollout.release_generation = release.generation
    rollout.save()


# ---- operator actions ------------------------------------------------------------------


def pause(rollout: Rollout, actor, reason: str = "", *, expected_generation: int | None = None) -> Rollout:
    with transaction.atomic():
        ServingGeneration.objects.lock()
        rollout = _locked(rollout)
        releases.check_expected_generation(rollout.model, rollout.model.current_release(), expected_generation)
        if rollout.status not in ANALYSED_ROLLOUT_STATUSES:
            raise RolloutConflict(f"rollout #{rollout.pk} is {rollout.get_status_display().lower()}: only a running rollout can be paused")
        _pause(rollout, actor, f"paused by {_who(actor)}{_because(reason)}")
    return rollout


def resume(rollout: Rollout, actor, reason: str = "", *, expected_generation: int | None = None) -> Rollout:
    """Back to running from the step it was on: the step's split is set again (a manual
    change may have replaced it) and the step's hold starts over."""
    with transaction.atomic():
        ServingGeneration.objects.lock()
        rollout = _locked(rollout)
        releases.check_expected_generation(rollout.model, rollout.model.current_release(), expected_generation)
        if rollout.status != RolloutStatus.PAUSED:
            raise RolloutConflict(f"rollout #{rollout.pk} is {rollout.get_status_display().lower()}: only a paused rollout can be resumed")
        _restart_step(rollout, timezone.now())
        rollout.status, rollout.status_reason = RolloutStatus.RUNNING, f"resumed by {_who(actor)}{_because(reason)}"
        events.rollout_event(rollout, actor, f"Rollout #{rollout.pk} {rollout.status_reason}", {"event": "resumed", "reason": reason})
        _apply_step(rollout, actor, reason)
    return rollout


def abort_target(rollout: Rollout, current: Release | None) -> int | None:
    """The version an abort sends all traffic to while ``current`` is in force, or None
    when it leaves the traffic as it is: what the abort button, its dialog and its answer
    say, and what ``abort`` does."""
    if current is None or current.generation == rollout.release_generation:
        return rollout.stable_version
    if versions_receiving(current.routes) == [current.stable_version]:
        # Someone changed the traffic since the rollout's last step (the pause says who),
        # onto one version: it stands. Back to the rollout's stable undid an operator's
        # promote of the canary, with no rollback to return to it.
        return None
    return current.stable_version  # a split made since: its own stable at 100 %, as "Abort to stable" does


NOT_PROMISED = object()


def abort(rollout: Rollout, actor, reason: str = "", *, expected_generation: int | None = None,
          promised_target: int | None | object = NOT_PROMISED) -> Rollout:
    """Stable back to 100 % at once (``abort_target`` says which, or that the traffic
    stays). Refused when what it would do is not what the operator was shown:
    ``promised_target`` (a version, or None for "the traffic stays", as the console's
    dialog promised it) must still be ``abort_target``; else, with ``expected_generation``
    (the API's), nothing may have changed. The console checks the promise, not the number:
    a running rollout makes a generation at each step, and an abort dialog open across a
    step was refused though the abort would do just what it said."""
    with transaction.atomic():
        ServingGeneration.objects.lock()
        rollout = _locked(rollout)
        if rollout.status not in ACTIVE_ROLLOUT_STATUSES:
            raise RolloutConflict(f"rollout #{rollout.pk} is already {rollout.get_status_display().lower()}")
        current = rollout.model.current_release()
        target = abort_target(rollout, current)
        if promised_target is NOT_PROMISED:
            releases.check_expected_generation(rollout.model, current, expected_generation)
        elif promised_target != target:
            raise RolloutConflict(f"the traffic changed since your page: generation {current.generation} "
                                  f"({releases.describe_routes(current)}) is in force, and an abort now {_abort_words(target)}, "
                                  f"not {_abort_words(promised_target)} as shown: nothing changed; reload and decide again")
        note = f"aborted by {_who(actor)}{_because(reason)}"
        if target is None:
            _finish(rollout, actor, RolloutStatus.ABORTED,
                    f"{note}; traffic left as generation {current.generation} ({releases.describe_routes(current)}), made since the rollout's last step",
                    generation=None)  # the abort made no release
        else:
            _finish_to_stable(rollout, actor, RolloutStatus.ABORTED, note, stable_version=target)
    return rollout


def abort_release(generation_before: int, aborted: Rollout) -> Release | None:
    """The release an abort made, or None when it left the traffic as it was (a paused
    rollout makes no step meanwhile, so a newer generation of its own is the abort's)."""
    if aborted.release_generation == generation_before:
        return None
    return Release.objects.get(generation=aborted.release_generation)


def _abort_words(target: int | None) -> str:
    return "leaves the traffic as it is" if target is None else f"sends all of it to v{target}"


def back_to_stable(model: RegisteredModel, actor, reason: str = "", *, expected_generation: int | None = None,
                   promised_version: int | None = None) -> tuple[Release, Rollout | None]:
    """The console's "Abort to stable": the active rollout's abort when one owns the
    model's traffic (the rollout then says it was aborted; refused unless it still sends
    everything to ``promised_version``, the stable the page showed), else the current
    stable at 100 %. The release made, and the rollout aborted (or None)."""
    active = model.rollouts.filter(status__in=ACTIVE_ROLLOUT_STATUSES).first()
    if active is not None:
        promise = NOT_PROMISED if promised_version is None else promised_version
        aborted = abort(active, actor, reason, expected_generation=expected_generation if promised_version is None else None,
                        promised_target=promise)
        return abort_release(active.release_generation, aborted), aborted
    release = releases.to_stable(model, None, actor, reason or "back to stable", expected_generation=expected_generation)
    return release, None


# ---- the analysis ----------------------------------------------------------------------


def analysis_overdue_s(rollout: Rollout, now: datetime | None = None) -> float | None:
    """How late the rollout's due window is, in seconds, once it is later than a few ticks
    can explain; None otherwise. Nothing else tells that the analysis stopped (the
    Celery worker that runs beat is down): the page went on saying "the first verdict is
    due at 01:03:42" at 01:04:12, and the canary stayed at its step unjudged."""
    if rollout.status not in ANALYSED_ROLLOUT_STATUSES:
        return None
    late_s = ((now or timezone.now()) - rollout.next_window_at).total_seconds()
    return late_s if late_s > overdue_after_s() else None


def overdue_after_s() -> float:
    """A due window is judged at the next tick (ROLLOUT_TICK_S); past three ticks and a
    slack for a slow tick or a busy broker (ROLLOUT_OVERDUE_SLACK_S) the analysis counts
    as stopped."""
    return 3 * django_settings.ROLLOUT_TICK_S + django_settings.ROLLOUT_OVERDUE_SLACK_S


class _Fallback:
    """When this process last looked for windows the analysis left overdue (monotonic)."""

    lock = threading.Lock()
    looked_at = float("-inf")


def judge_overdue(now: datetime | None = None) -> int:
    """The console's own tick, for when Celery's is not coming: the rollouts judged.

    Beat runs the analysis through Redis, Celery's broker. With Redis down (or the
    worker that runs beat gone) no window was judged, and a failing canary kept its share
    of the traffic for the whole outage, although the workers' reports still reached the
    console over HTTP. Each report now lets this process look, at most once a
    ROLLOUT_TICK_S, for a window overdue past three ticks (``analysis_overdue_s``) and then
    judges every due window itself: ``tick`` is idempotent, so a beat that comes back
    meanwhile judges nothing twice."""
    with _Fallback.lock:
        clock = time.monotonic()
        if clock - _Fallback.looked_at < django_settings.ROLLOUT_TICK_S:
            return 0
        _Fallback.looked_at = clock
    now = now or timezone.now()
    overdue = Rollout.objects.filter(status__in=ANALYSED_ROLLOUT_STATUSES,
                                     next_window_at__lt=now - timedelta(seconds=overdue_after_s()))
    pks = list(overdue.values_list("pk", flat=True)[:20])
    if not pks:
        return 0
    logger.warning("the canary analysis is overdue for rollout(s) %s (Celery beat or its broker, Redis, is not running it): "
                   "the console judges the due windows itself", ", ".join(f"#{pk}" for pk in pks))
    return tick(now, by_console=True)


def tick(now: datetime | None = None, *, by_console: bool = False) -> int:
    """Judge every rollout whose window is due; the number judged. Idempotent: a window
    already judged by another process is not judged again. ``by_console``: the console's
    fallback judges (``judge_overdue``), which each verdict says."""
    now = now or timezone.now()
    due = Rollout.objects.filter(status__in=ANALYSED_ROLLOUT_STATUSES, next_window_at__lte=now).values_list("pk", flat=True)
    judged = 0
    for pk in list(due):
        try:
            judged += analyse(pk, now, by_console=by_console)
        except Exception as error:
            if not is_database_unavailable(error):
                logger.exception("analysis of rollout %s failed", pk)
            else:  # a lock held past DATABASE_LOCK_TIMEOUT_S, a blip: the next tick judges it
                logger.warning("analysis of rollout %s postponed: the database is busy or unavailable (%s)", pk, type(error).__name__)
    samples.prune(now)
    return judged


def analyse(pk: int, now: datetime, *, by_console: bool = False) -> bool:
    """Judge rollout ``pk``'s last window if it is due; True when a verdict was recorded."""
    with transaction.atomic():
        ServingGeneration.objects.lock()
        rollout = Rollout.objects.select_for_update().select_related("model").get(pk=pk)
        if rollout.status not in ANALYSED_ROLLOUT_STATUSES or rollout.next_window_at > now:
            return False
        if _paused_by_manual_change(rollout):
            return False
        behind_s = reports_behind_s(rollout, now)
        if behind_s is not None:
            _wait_for_reports(rollout, behind_s)
            return False
        verdict = _judge_window(rollout, now, _judged_late(rollout, now) if by_console else "")
        _act_on(rollout, verdict, now)
    return True


def reports_behind_s(rollout: Rollout, now: datetime) -> float | None:
    """How old the newest report is, when the console hears from no worker within half
    WORKER_GONE_AFTER_S and the window's reports stop short of its end: the reports of the
    window's versions in it, or, when none reached it, those of a worker live as it began
    (an outage just after the last verdict). None otherwise: a worker restarted with no
    traffic sends no figures, and a window with no worker at all is judged as waiting for
    data. Judged while the console could not take reports, a window passed on 6 of its 12 s
    and promoted a canary that failed 1,389 requests."""
    allowed_s = django_settings.WORKER_GONE_AFTER_S / 2
    if Worker.objects.filter(last_seen_at__gte=now - timedelta(seconds=allowed_s)).exists():
        return None  # the reports reach the console
    start = _window_start(rollout)
    latest = ReportSample.objects.filter(
        version__model_id=rollout.model_id, version__number__in=(rollout.canary_version, rollout.stable_version),
        received_at__gte=start, received_at__lt=now,
    ).aggregate(newest=Max("received_at"))["newest"]
    if latest is None:
        live_as_it_began = Worker.objects.filter(last_seen_at__gte=start - timedelta(seconds=django_settings.WORKER_GONE_AFTER_S)).exclude(SAID_STOPPED)
        latest = live_as_it_began.aggregate(newest=Max("last_seen_at"))["newest"]
        if latest is None:
            return None
    behind_s = (now - latest).total_seconds()
    return behind_s if behind_s > allowed_s else None


def _wait_for_reports(rollout: Rollout, behind_s: float) -> None:
    """Not judged: said in its status (once, not at every tick), and judged at the first
    tick that finds the reports current, over the whole window since."""
    reason = (f"{REPORTS_BEHIND}: the newest that reached the console is over {int(behind_s)} s old (the console, its "
              "database or the workers' way to it is down); the window is judged once they arrive")
    if not rollout.status_reason.startswith(REPORTS_BEHIND):
        logger.warning("rollout #%s: %s", rollout.pk, reason)
    rollout.status_reason = reason
    rollout.save(update_fields=["status_reason"])


def _judged_late(rollout: Rollout, now: datetime) -> str:
    """What a verdict of the console's fallback adds to its reason when its window was
    overdue: the operator learns that beat is not running (retention and the job sweep stop
    with it). Nothing for a window the same fallback judged a moment after it fell due."""
    late_s = analysis_overdue_s(rollout, now)
    if late_s is None:
        return ""
    return (f" (judged by the console {late_s:.0f} s after it was due: Celery beat, or its broker Redis, "
            "is not running the analysis)")


def waits_for_reports(rollout: Rollout) -> bool:
    return rollout.status in ANALYSED_ROLLOUT_STATUSES and rollout.status_reason.startswith(REPORTS_BEHIND)


def _judge_window(rollout: Rollout, now: datetime, note: str = "") -> RolloutVerdict:
    settings = AnalysisSettings.parse(rollout.analysis)
    start = _window_start(rollout)
    versions = {version.number: version for version in rollout.model.versions.filter(number__in=[rollout.canary_version, rollout.stable_version])}
    canary, stable = (aggregate(samples.window(versions[number], start, now)) if number in versions else aggregate([])
                      for number in (rollout.canary_version, rollout.stable_version))
    if rollout.current_weight == 0:
        canary = canary.as_shadow()
    verdict = judge(canary, stable, settings)
    if verdict.result == WAITING_FOR_DATA:
        verdict = failed_if_unloadable(verdict, rollout)
    body = finite_or_null({**verdict.to_json(), "canary": canary.summary(), "stable": stable.summary()})
    rollout.windows_judged += 1
    rollout.next_window_at = now + timedelta(seconds=settings.interval_s)
    return RolloutVerdict.objects.create(
        rollout=rollout, number=rollout.windows_judged, step_index=rollout.step_index, weight=rollout.current_weight,
        window_start=start, window_end=now, result=body["result"], reason=body["reason"] + note, signals=body["signals"],
        canary=body.get("canary", {}), stable=body.get("stable", {}),
    )


def failed_if_unloadable(verdict: Verdict, rollout: Rollout) -> Verdict:
    """A window waiting for data fails when the canary waits because no worker can load
    it: it waited for ever ("waiting for data, 0 requests"), where Argo Rollouts aborts a
    canary that never becomes ready. It counts toward ``failure_limit`` like any failure."""
    why = load_failure(rollout.model.name, rollout.canary_version)
    if why is None:
        return verdict
    signal = {"name": "canary_loaded", "passed": False, "value": 0, "stable_value": None, "threshold": None, "detail": why}
    return Verdict(FAIL, [*verdict.signals, signal], why)


def _window_start(rollout: Rollout) -> datetime:
    """Where the window judged now begins: where this step's last one ended (its start for
    the first), so windows leave no gap. Judged as the last ``interval_s`` only, a tick late
    by an outage of the analysis let a step advance on a fraction of its hold, the canary's
    answers during the outage never judged."""
    last = rollout.verdicts.filter(step_index=rollout.step_index, window_end__gt=rollout.step_started_at).order_by("-number").first()
    return last.window_end if last is not None else rollout.step_started_at


def _act_on(rollout: Rollout, verdict: RolloutVerdict, now: datetime) -> None:
    settings = AnalysisSettings.parse(rollout.analysis)
    window = f"window {verdict.number} (step {rollout.step_index + 1}, {rollout.current_weight}%)"
    events.rollout_event(rollout, None, f"Rollout #{rollout.pk} {window}: {verdict.result.replace('_', ' ')}. {verdict.reason}".strip(),
                         {"event": "verdict", "verdict": verdict.number, "result": verdict.result})
    if verdict.result == "waiting_for_data":
        rollout.status, rollout.status_reason = RolloutStatus.WAITING_FOR_DATA, verdict.reason
        rollout.save()
        return
    if verdict.result == "fail":
        rollout.consecutive_failures += 1
        rollout.status, rollout.status_reason = RolloutStatus.RUNNING, f"{window} failed: {verdict.reason}"
        if rollout.consecutive_failures >= settings.failure_limit:
            note = (f"rolled back automatically after {rollout.consecutive_failures} consecutive failing windows; "
                    f"last: {verdict.reason}")
            _finish_to_stable(rollout, None, RolloutStatus.ROLLED_BACK, note)
            return
        rollout.save()
        return
    rollout.consecutive_failures = 0
    rollout.status, rollout.status_reason = RolloutStatus.RUNNING, f"{window} passed"
    if (now - rollout.step_started_at).total_seconds() >= rollout.step_duration_s:
        _advance(rollout, now)
    else:
        rollout.save()


def _advance(rollout: Rollout, now: datetime) -> None:
    rollout.step_index += 1
    if rollout.current_weight == 100:
        _promote(rollout)
        return
    _restart_step(rollout, now)
    events.rollout_event(rollout, None, f"Rollout #{rollout.pk} advanced to step {rollout.step_index + 1}/{len(rollout.steps)}: "
                         f"v{rollout.canary_version} at {rollout.current_weight}%", {"event": "step", "step": rollout.step_index + 1})
    try:
        _apply_step(rollout, None)
    except releases.ReleaseError as error:
        _pause(rollout, None, f"could not set step {rollout.step_index + 1}: {error.message}")


def _promote(rollout: Rollout) -> None:
    note = f"rollout #{rollout.pk}: every step passed, v{rollout.canary_version} promoted"
    try:
        release = releases.promote(rollout.model, None, note, rollout=rollout)
    except releases.ReleaseError as error:
        rollout.step_index -= 1
        _pause(rollout, None, f"could not promote: {error.message}")
        return
    rollout.release_generation = release.generation
    _finish(rollout, None, RolloutStatus.PROMOTED, f"every step passed; v{rollout.canary_version} promoted at generation {release.generation}")


def _finish_to_stable(rollout: Rollout, actor, status: str, note: str, stable_version: int | None = None) -> None:
    stable_version = rollout.stable_version if stable_version is None else stable_version
    release = releases.to_stable(rollout.model, stable_version, actor, f"rollout #{rollout.pk} {note}", rollout=rollout)
    rollout.release_generation = release.generation
    _finish(rollout, actor, status, f"{note} (generation {release.generation}: v{stable_version} at 100%)")


def _finish(rollout: Rollout, actor, status: str, note: str, **data) -> None:
    rollout.status, rollout.status_reason, rollout.finished_at = status, note, timezone.now()
    rollout.save()
    events.rollout_event(rollout, actor, f"Rollout #{rollout.pk} {rollout.get_status_display().lower()}: {note}", {"event": status, **data})


def _restart_step(rollout: Rollout, now: datetime) -> None:
    interval_s = AnalysisSettings.parse(rollout.analysis).interval_s
    rollout.step_started_at, rollout.next_window_at, rollout.consecutive_failures = now, now + timedelta(seconds=interval_s), 0


def _paused_by_manual_change(rollout: Rollout) -> bool:
    """The safety net behind ``releases``' own pause: a newer release the rollout did not make."""
    current = rollout.model.current_release()
    if current is None or current.generation == rollout.release_generation:
        return False
    _pause(rollout, None, f"paused: generation {current.generation} ({current.get_action_display().lower()}) was not made by this rollout")
    return True


def _pause(rollout: Rollout, actor, note: str) -> None:
    rollout.status, rollout.status_reason = RolloutStatus.PAUSED, note
    rollout.save()
    events.rollout_event(rollout, actor, f"Rollout #{rollout.pk} {note}", {"event": "paused"})


def _locked(rollout: Rollout) -> Rollout:
    return Rollout.objects.select_for_update().select_related("model").get(pk=rollout.pk)


def _who(actor) -> str:
    return actor.get_username() if actor is not None and actor.is_authenticated else "the console"


def _because(reason: str) -> str:
    return f" ({reason})" if reason else ""
