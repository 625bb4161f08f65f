"""What a drill's own process could not finish, finished by the console: beat runs
``finish_stale_drills`` every 30 s (``registry.tasks.abandon_stale_drills``), and every
drill's start runs it for its model.

A drill still running past the longest a live one takes has no process left (the console
stopped, or its database was gone for longer than the drill retries): it is failed, saying
what it left in force. A drill that asked to roll forward and whose roll forward was
neither made nor ruled out by then (``forward_pending``) is rolled forward here, over its
own rollback only: before, an outage longer than ``DRILL_ACK_TIMEOUT_S`` (10 s; a
database failover takes longer) left the model serving what the drill rolled back to
until someone noticed.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.actions import events, releases
from registry.domain.choices import DrillStatus, ReleaseAction, RolloutStatus
from registry.fleet.workers import failed_to_apply
from registry.models import Drill, RegisteredModel, Release, ServingGeneration, WorkerAck

logger = logging.getLogger(__name__)


def longest_drill_s() -> float:
    """The longest a live drill's process works on it: its wait for acks (DRILL_ACK_TIMEOUT_S
    from the click), ``through_outage`` recording its end and its roll forward's acks (as
    long again each); a minute is room for slow queries, since a live drill finished here
    too would be recorded twice. Past it, nothing but this module finishes the drill."""
    return 3 * settings.DRILL_ACK_TIMEOUT_S + 60


def forward_reason(drill: Drill) -> str:
    """The reason of a drill's roll-forward release, by which a retry finds its own."""
    return f"roll forward after drill #{drill.pk}"


def own_roll_forward(drill: Drill, actor) -> Release | None:
    """The release this drill's roll forward committed already, if one did: a restore of
    ``from_generation``'s routes after the drill's rollback, by its actor, with its reason."""
    return Release.objects.filter(
        model_id=drill.model_id, generation__gt=drill.to_generation, action=ReleaseAction.RESTORE, reason=forward_reason(drill),
        actor=actor if actor is not None and actor.is_authenticated else None,
    ).order_by("generation").first()


def finish_stale_drills(model: RegisteredModel | None = None, now=None) -> int:
    """Fail the stale running drills of ``model`` (or of every model), then make the roll
    forwards stale drills still owe; how many drills this changed."""
    now = now or timezone.now()
    return abandon_stale_drills(model, now) + len(roll_forward_owed(model, now))


def owing_drills(model: RegisteredModel | None = None):
    """Finished drills whose roll forward is neither made nor ruled out yet."""
    owing = Drill.objects.filter(forward_pending=True, to_generation__isnull=False).exclude(status=DrillStatus.RUNNING)
    return owing if model is None else owing.filter(model=model)


def roll_forward_owed(model: RegisteredModel | None = None, now=None) -> list[Drill]:
    """Settle the roll forward of each drill of ``model`` (or of every model) that owes one
    and is past the longest a live drill takes; the drills settled, each with the release
    it made (``forward_generation``) or none."""
    now = now or timezone.now()
    due = owing_drills(model).filter(started_at__lt=now - timedelta(seconds=longest_drill_s()))
    settled = (_roll_forward_owed(pk, now) for pk in due.order_by("pk").values_list("pk", flat=True))
    return [drill for drill in settled if drill is not None]


def abandon_stale_drills(model: RegisteredModel | None = None, now=None) -> int:
    """Finish as failed, with an audit entry each, the drills of ``model`` (or of every
    model) still running past ``longest_drill_s``; the number finished. A drill the console
    stopped during said "running" for ever, kept its model rolled back in silence and
    refused the next drill. Running it again, or beside a live drill, changes nothing it
    should not: a drill inside its bound is never touched (``_abandon``)."""
    now = now or timezone.now()
    stale = Drill.objects.filter(status=DrillStatus.RUNNING, started_at__lt=now - timedelta(seconds=longest_drill_s()))
    if model is not None:
        stale = stale.filter(model=model)
    return sum(_abandon(drill, now) for drill in stale.select_related("model", "actor").order_by("pk"))


def _abandon(drill: Drill, now) -> bool:
    """One stale drill finished as failed, by an UPDATE that still requires it running and
    past its bound: a drill whose own process records its end meanwhile keeps that end,
    and a second sweep finds nothing. Its ``finished_at`` is the latest it could have ended
    (``started_at`` + the bound), not when it was found: a sweep late by the console's
    downtime would have read as a drill that took that long."""
    longest_s = longest_drill_s()
    drill.status, drill.finished_at = DrillStatus.FAILED, drill.started_at + timedelta(seconds=longest_s)
    drill.error = _abandoned_words(drill, longest_s, now)
    drill.workers = drill.workers or _acks_received(drill)
    with transaction.atomic():
        still_stale = Drill.objects.filter(pk=drill.pk, status=DrillStatus.RUNNING, started_at__lt=now - timedelta(seconds=longest_s))
        if not still_stale.update(status=drill.status, finished_at=drill.finished_at, error=drill.error, workers=drill.workers):
            return False
        events.drill_finished(drill)
    logger.warning("drill #%s on %s: %s", drill.pk, drill.model.name, drill.error)
    return True


def _abandoned_words(drill: Drill, longest_s: float, now) -> str:
    """Why the drill is failed and what it left in force; how to undo it, unless the roll
    forward it owes is made next (``_roll_forward_owed`` then says how that went: saying
    here the rollback "is still in force" read as a contradiction once it was rolled forward)."""
    words = (f"abandoned: the console stopped during the drill (or lost its database for longer than the drill waits): "
             f"not finished {longest_s:g} s after it started, found at {now:%Y-%m-%d %H:%M:%S} UTC; ")
    if drill.to_generation is None:  # stopped before its rollback was recorded: it may or may not have committed
        return (f"{words}its rollback may or may not have been made (check {drill.model.name}'s current release), "
                f"and no roll forward was made{_how_to_return(drill)}")
    if drill.forward_pending:
        return f"{words}it rolled back to generation {drill.to_generation}, and the roll forward it owes follows"
    return (f"{words}its rollback to generation {drill.to_generation} is still in force unless {drill.model.name} was changed since, "
            f"and no roll forward was made{_how_to_return(drill)}")


def _acks_received(drill: Drill) -> list[dict]:
    """The acks of the drill's rollback the console received while no process watched
    them, as its rows (no report was watched: none is confirmed)."""
    if drill.to_generation is None:
        return []
    acks = WorkerAck.objects.filter(generation=drill.to_generation, received_at__gte=drill.started_at).order_by("received_at")
    return [{"worker": ack.worker_id, "ack_s": round((ack.received_at - drill.started_at).total_seconds(), 3), "ok": ack.ok,
             "error": _unwatched(ack), "note": "", "confirmed_s": None, "silent_before_s": None, "generation": None, "digest": None,
             "model_digest": None, "failed_requests": None, "restarted": "", "quiet_after_confirming": ""} for ack in acks]


def _unwatched(ack: WorkerAck) -> str:
    """A row's reason: no report was looked at, so nothing is confirmed, whatever the ack said
    (one applied but for another model read as a plain failure)."""
    unwatched = "acked while no drill process watched: no report was looked at"
    return f"{failed_to_apply(ack.error)}; {unwatched}" if not ack.ok else unwatched


def _how_to_return(drill: Drill) -> str:
    if drill.from_generation is None:
        return ""
    earlier = Release.objects.filter(model_id=drill.model_id, generation=drill.from_generation).first()
    split = f"{releases.describe_routes(earlier)}, " if earlier is not None else ""
    generation = drill.from_generation
    return f": to return to the split it rolled back from ({split}generation {generation}), restore generation {generation}"


def _roll_forward_owed(pk: int, now) -> Drill | None:
    """Restore the drill's ``from_generation`` over its rollback, or say why not, and clear
    ``forward_pending`` in the same transaction. Under the generation lock (taken first, as
    a drill's start takes it) and the drill's row lock, so two sweeps make it once; a
    restore an earlier try committed is found, never taken for someone else's change."""
    with transaction.atomic():
        ServingGeneration.objects.lock()
        drill = Drill.objects.select_for_update(of=("self",)).select_related("model", "actor").filter(pk=pk, forward_pending=True).first()
        if drill is None:
            return None
        words = "; ".join(filter(None, [_make_roll_forward(drill, now), _paused_rollout_words(drill)]))
        drill.forward_pending = False
        drill.error = "; ".join(filter(None, [drill.error, words]))
        drill.save(update_fields=["forward_pending", "forward_generation", "error"])
        events.drill_roll_forward_settled(drill, words)
    logger.warning("drill #%s on %s: %s", drill.pk, drill.model.name, words)
    return drill


def _paused_rollout_words(drill: Drill) -> str:
    """The rollout the drill's rollback paused, which a roll forward restores the split of
    but does not resume (as a live drill says, ``drills._note_paused_rollout``)."""
    paused_by_rollback = f"(generation {drill.to_generation}, "  # as releases._pause_rollouts words its reason
    for rollout in drill.model.rollouts.filter(status=RolloutStatus.PAUSED):
        if paused_by_rollback in rollout.status_reason:
            return f"rollout #{rollout.pk} was paused by the drill's rollback and stays paused until it is resumed"
    return ""


def _make_roll_forward(drill: Drill, now) -> str:
    """The drill's late roll forward, made or refused, in words; sets ``forward_generation``."""
    model, late_s = drill.model, (now - drill.started_at).total_seconds()
    release = own_roll_forward(drill, drill.actor)
    try:
        if release is None:
            release = releases.restore(model, drill.from_generation, drill.actor, forward_reason(drill), expected_generation=drill.to_generation,
                                       checked=False)
    except releases.GenerationConflict as conflict:
        changed_at = conflict.current.generation if conflict.current else "?"
        return (f"not rolled forward: {model.name} changed after the drill (generation {changed_at}), and that change stands"
                f"{_how_to_return(drill)}")
    except releases.ReleaseError as error:
        return f"roll forward failed: {error.message}{_how_to_return(drill)}"
    drill.forward_generation = release.generation
    return (f"rolled forward to generation {release.generation} by the console's drill sweep {late_s:.0f} s after the drill "
            "started (the drill's own request could not: the database or the console was down); the workers' acks of it were not watched")
