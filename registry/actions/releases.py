"""Traffic changes: the only module that writes ``Release`` rows.

Each change is one transaction that locks the serving generation (so changes to any
model serialise and generations stay gap-free), checks the request, appends a
``Release`` and publishes the whole desired state to the workers after commit.

Rollback is "undo": every release remembers the release a rollback from it returns
to (``rollback_target``), so rolling back twice walks back twice. An abort to stable is a
rollback too: a rollback after it walks on past the aborted canary, never back onto it.

Archiving a served model is a release too (``archive_traffic``): one with no routes that
leaves the model out of the desired state from its generation on, keeping the stable
version and, as rollback target, the release it replaced, so ``restore_from_archive``
brings back exactly what was served and retention keeps those artifacts. While the model
is archived every other traffic change is refused.

Every change may carry ``expected_generation``: the generation of the model's newest
release as the operator saw it (the number on the model page; 0 when the model has no
release yet). It is compared under the same lock that serialises the change, so a double
click or two operators acting on the same page make one change, and the other gets a
``GenerationConflict`` that says which release replaced the one they saw. ``None`` skips
the comparison (API clients that do not send it keep the old last-writer-wins meaning).
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from registry.actions import events
from registry.artifacts import served_bytes, storage
from registry.committed_change import note_pending
from registry.domain.choices import (
    ACTIVE_ROLLOUT_STATUSES,
    ANALYSED_ROLLOUT_STATUSES,
    ReleaseAction,
    RolloutStatus,
)
from registry.domain.compatibility import input_differences
from registry.domain.reasons import has_visible_text
from registry.domain.traffic import InvalidRoutes, Route, VersionNotReady, check_routes, not_ready_words, routes_to_json, versions_receiving
from registry.domain.version_metrics import evaluation_regressions
from registry.fleet.workers import live_workers_brief, load_failure
from registry.models import (
    ModelVersion,
    RegisteredModel,
    Release,
    Rollout,
    ServingGeneration,
)

logger = logging.getLogger(__name__)


class ReleaseError(Exception):
    """A traffic change that cannot be made; ``status`` is the HTTP answer."""

    status = 400

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def details(self) -> dict:
        """Fields an answer carries beside ``error``."""
        return {}


class ReleaseConflict(ReleaseError):
    status = 409


class IncompatibleInputs(ReleaseConflict):
    """Traffic to a version whose inputs differ from the stable version's, not forced.
    ``refusal`` is what is wrong; the message adds how an API client forces it (the
    console names its own Force control instead)."""

    def __init__(self, stable_version: int, differences: list[str]):
        self.refusal = f"inputs differ from the stable v{stable_version}'s ({'; '.join(differences)}): clients would be refused"
        super().__init__(f"{self.refusal}; send force: true with a reason to route traffic to it anyway")


class GenerationConflict(ReleaseConflict):
    """The model's traffic changed since the operator looked: nothing was done."""

    def __init__(self, message: str, *, expected_generation: int, current: Release | None):
        super().__init__(message)
        self.expected_generation = expected_generation
        self.current = current

    def details(self) -> dict:
        current = self.current
        return {
            "expected_generation": self.expected_generation,
            "current_generation": current.generation if current else 0,
            "current_action": current.action if current else None,
            "current_actor": _actor_name(current),
            "current_at": current.created_at.isoformat() if current else None,
        }


def set_routes(model: RegisteredModel, routes: list[dict], actor, reason: str = "", *, expected_generation: int | None = None,
               force: bool = False, rollout: Rollout | None = None) -> Release:
    """``force`` (with a reason) routes traffic to a version whose inputs differ from the
    stable version's; ``rollout`` is the rollout making this change (any other change
    pauses a running rollout of the model)."""
    with transaction.atomic():
        counter = ServingGeneration.objects.lock()
        current = model.current_release()
        check_expected_generation(model, current, expected_generation)
        check_not_archived(model)
        try:
            parsed = check_routes(routes, _ready_numbers(model))
        except VersionNotReady as error:
            raise ReleaseError(version_not_ready(model, error.version)) from None
        except InvalidRoutes as error:
            raise ReleaseError(str(error)) from None
        if rollout is None and current is not None and _same_routes(parsed, current):
            # A new generation that changes nothing would become the rollback point: the
            # one-click rollback would then "return" to the very split being served.
            raise ReleaseConflict(f"{model.name} already serves {describe_routes(current)} (generation {current.generation}): nothing to change")
        stable = _stable_for(parsed, current)
        forced = check_compatible(model, current, parsed, force, reason)
        # A split to 100 % is a promote by another door (an operator's second run took it).
        unloadable = [] if rollout is not None else _unloadable(model, current, parsed, force, reason)
        # A rollback from a rollout's step returns to its stable at 100 %, as its abort does:
        # returning to the release before walked back through the rollout's own steps (a
        # drill's rollback raised the canary to a 30 % split the rollout had replaced).
        target = current if rollout is None else (last_all_stable(model, stable) or current)
        worse = [] if rollout is not None else evaluated_worse(model, current, _answering(parsed))
        release = _append(counter, model, parsed, stable, ReleaseAction.SET_ROUTES, target, actor, reason, rollout=rollout)
        message = f"Traffic set to {_describe(parsed)} (generation {release.generation})"
        if forced:
            message += f"; forced onto incompatible inputs ({'; '.join(forced)}): {reason}"
        if unloadable:
            message += f"; forced although {'; '.join(unloadable)}: {reason}"
        _made(release, message, forced + unloadable, worse)
    return release


def promote_returns_to(model: RegisteredModel, current: Release) -> Release:
    """What a rollback after promoting ``current``'s canary returns to: the last release
    that sent everything to the old stable, else ``current`` (the console's promote dialog
    says it)."""
    return last_all_stable(model, current.stable_version) or current


def promote(model: RegisteredModel, actor, reason: str = "", *, expected_generation: int | None = None, rollout: Rollout | None = None,
            force: bool = False) -> Release:
    """The canary becomes the stable at 100 %. Rolling back from here returns to the last
    release that sent everything to the old stable, not to the split before the promote
    (which would leave part of the traffic on the version being rolled away from). A
    canary the live workers say they cannot load is promoted only with ``force`` and a
    reason (a rollout's promotion follows its analysis, which fails such a canary first)."""
    with transaction.atomic():
        counter = ServingGeneration.objects.lock()
        check_expected_generation(model, model.current_release(), expected_generation)
        check_not_archived(model)
        current = require_current(model)
        canary = _only_canary(current)
        _check_still_ready(model, [canary])
        unloadable = check_loadable(model, canary, force, reason) if rollout is None else None
        routes = [Route(version=canary, weight=100)]
        worse = [] if rollout is not None else evaluated_worse(model, current, _answering(routes))
        target = promote_returns_to(model, current)
        release = _append(counter, model, routes, canary, ReleaseAction.PROMOTE, target, actor, reason, rollout=rollout)
        message = (f"Version {canary} promoted to stable at 100% (generation {release.generation}); "
                   f"a rollback returns to {describe_routes(target)} (generation {target.generation})")
        if unloadable:
            message += f"; forced although {unloadable}: {reason}"
        _made(release, message, [unloadable] if unloadable else [], worse)
    return release


def evaluated_worse(model: RegisteredModel, current: Release | None, versions) -> list[str]:
    """Each of ``versions`` (those a change sends answered traffic to), other than
    ``current``'s stable, that was evaluated worse than that stable on the same bytes of a
    data set, in words ("v2 was evaluated worse than the stable v1: accuracy 11.0% on
    holdout, against v1's accuracy 89.0%"). Said, not refused: the console asks before, and
    an API client reads it in the answer (before, only the console's dialogs said it)."""
    if current is None or current.stable_version is None:
        return []
    others = sorted(set(versions) - {current.stable_version})
    if not others:
        return []
    by_number = {version.number: version for version in model.versions.filter(number__in=[current.stable_version, *others])}
    stable = by_number.get(current.stable_version)
    if stable is None:
        return []
    datasets = list(model.datasets.all())
    return [f"v{number} was evaluated worse than the stable v{stable.number}: {'; '.join(lines)}" for number in others
            if number in by_number and (lines := evaluation_regressions(by_number[number], stable, datasets))]


def _answering(routes: list[Route]) -> list[int]:
    """The versions ``routes`` send answered traffic to (a shadow's mirrored copies are not answers)."""
    return [route.version for route in routes if route.weight > 0]


def _made(release: Release, message: str, forced: list[str], worse: list[str]) -> None:
    """The change's audit event; ``worse`` is kept in it and on ``release.evaluated_worse``
    (not a column: it is what this call was told, for its answer)."""
    if worse:
        message += "; " + "; ".join(worse)
    events.release_made(release, message, forced=forced or None, evaluated_worse=worse or None)
    release.evaluated_worse = worse


def to_stable(model: RegisteredModel, stable_version: int | None, actor, reason: str, *, expected_generation: int | None = None,
              rollout: Rollout | None = None) -> Release:
    """Everything back on ``stable_version`` at once (a rollout's abort or automatic
    rollback); None means the current release's stable, read under the lock (the
    console's "Abort to stable"). A rollback from here never returns to the aborted
    canary (``_rollback_target_after_abort``)."""
    with transaction.atomic():
        counter = ServingGeneration.objects.lock()
        check_expected_generation(model, model.current_release(), expected_generation)
        check_not_archived(model)
        current = require_current(model)
        stable_version = current.stable_version if stable_version is None else stable_version
        _check_still_ready(model, [stable_version])
        routes = [Route(version=stable_version, weight=100)]
        if rollout is None and _same_routes(routes, current):  # as set_routes: no generation that changes nothing
            raise ReleaseConflict(f"{model.name} already serves {describe_routes(current)} (generation {current.generation}): "
                                  "no canary takes traffic, nothing to change")
        target = _rollback_target_after_abort(current, routes)
        release = _append(counter, model, routes, stable_version, ReleaseAction.ROLLBACK, target, actor, reason, rollout=rollout)
        events.release_made(release, f"Traffic back to v{stable_version} 100% (generation {release.generation}): {reason}")
    return release


def _rollback_target_after_abort(current: Release, routes: list[Route]) -> Release | None:
    """Where a rollback after an abort from ``current`` to ``routes`` returns: the newest
    release of ``current``'s rollback chain that routes none of the aborted versions and
    serves something other than the abort. With ``current`` as the target, "Roll back"
    would undo the abort and send traffic to the canary just judged bad; the release
    before the canary usually serves what the abort serves, and a rollback from the
    abort then goes where a rollback from that release would. None (no rollback) when
    the chain holds nothing else, or only further back than the lookback."""
    aborted = set(current.routed_versions()) - {route.version for route in routes}
    release = current
    for _ in range(ALL_STABLE_LOOKBACK):
        if release is None:
            return None
        # An earlier attempt at the same canary may sit further back: walk past it too.
        if not aborted & set(release.routed_versions()) and not _same_routes(routes, release):
            return release
        release = release.rollback_target
    return None


def abort_ended_chain(release: Release) -> str | None:
    """Why ``release``, which has no rollback target, has none when its abort is the reason,
    in words: the release it replaced had earlier splits on its rollback chain, but each
    routes the aborted canary or serves what the abort serves (``_rollback_target_after_abort``
    walked past them all), as when the old stable came back as a canary. None when the
    chain had nothing else to give (a first release, a chain walked back to its start)."""
    if release.action != ReleaseAction.ROLLBACK:
        return None
    replaced = release.model.releases.filter(generation__lt=release.generation).first()
    if replaced is None:
        return None
    aborted = sorted(set(replaced.routed_versions()) - set(release.routed_versions()))
    served = [Route.from_json(route) for route in release.routes]
    # A plain rollback's replaced release has only the split it returned to further back.
    walked_past = [earlier for earlier in _chain(replaced.rollback_target) if not _same_routes(served, earlier)]
    if not aborted or not walked_past:
        return None
    return (f"the abort of {_versions_words(aborted)} at generation {release.generation} ended the rollback chain — "
            f"every earlier split on it routes {' or '.join(f'v{number}' for number in aborted)} or serves {_describe(served)}, "
            f"as generation {release.generation} does")


def _chain(release: Release | None) -> list[Release]:
    """``release`` and the releases a rollback from it walks back through, as far as the lookback."""
    chain = []
    while release is not None and len(chain) < ALL_STABLE_LOOKBACK:
        chain.append(release)
        release = release.rollback_target
    return chain


def last_all_stable(model: RegisteredModel, stable_version: int) -> Release | None:
    """The newest release that sent all weighted traffic to ``stable_version``."""
    for release in model.releases.order_by("-generation")[:ALL_STABLE_LOOKBACK]:
        weighted = [route for route in release.routes if route["weight"] > 0]
        if len(weighted) == 1 and weighted[0]["version"] == stable_version:
            return release
    return None


def rollback_preview(release: Release | None) -> str | None:
    """What a rollback from ``release`` returns to, in words (the confirmation shows it);
    None when there is no rollback, or it would be refused (``rollback_refusal``)."""
    if release is None or release.rollback_target is None or release.is_archive or rollback_refusal(release):
        return None
    return describe_rollback_target(release.rollback_target)


def describe_rollback_target(target: Release) -> str:
    """A rollback target in words: its split and generation."""
    return f"{describe_routes(target)} (generation {target.generation})"


def rollback_refusal(release: Release) -> str | None:
    """Why a rollback from ``release`` to its rollback target would be refused; None when
    it would be made (or there is no target). The console offers no rollback it would refuse."""
    target = release.rollback_target
    if target is None or release.is_archive:
        return None
    routes = [Route.from_json(route) for route in target.routes]
    if _same_routes(routes, release):
        # A rollback that changes nothing would still be a new generation, and a drill of it would "pass".
        return (f"nothing to roll back to: generation {target.generation}, the release before, routes the same "
                f"traffic ({_describe(routes)}); restore an earlier generation from the history instead")
    # Retention may have archived them: the rollback chain walked back past RETENTION_ROLLBACK_DEPTH.
    return _not_ready(release.model, [route.version for route in routes])


def restore_refusal(model: RegisteredModel, earlier: Release) -> str | None:
    """Why the console offers no restore of ``earlier``: it serves nothing (an archive),
    it is what is served now, the model is archived, or its versions are gone. None when
    the restore would be made."""
    if earlier.is_archive:
        return f"generation {earlier.generation} archived {model.name}: it served nothing"
    if model.archived_at is not None:
        return f"{model.name} is archived: restore it from the archive first"
    current = model.current_release()
    routes = [Route.from_json(route) for route in earlier.routes]
    if current is not None and _same_routes(routes, current):
        return f"{model.name} already serves this split ({_describe(routes)}, generation {current.generation})"
    return _not_ready(model, [route.version for route in routes])


ALL_STABLE_LOOKBACK = 500


def rollback(model: RegisteredModel, actor, reason: str = "", *, expected_generation: int | None = None) -> Release:
    with transaction.atomic():
        counter = ServingGeneration.objects.lock()
        check_expected_generation(model, model.current_release(), expected_generation)
        check_not_archived(model)
        current = require_current(model)
        target = current.rollback_target
        if target is None:
            raise ReleaseConflict(_nothing_before(model, current))
        refusal = rollback_refusal(current)
        if refusal:
            raise ReleaseConflict(refusal)
        routes = [Route.from_json(route) for route in target.routes]
        note = reason or f"rollback of generation {current.generation}, back to the routes of generation {target.generation}"
        release = _append(counter, model, routes, target.stable_version, ReleaseAction.ROLLBACK, target.rollback_target, actor, note)
        events.release_made(release, f"Rolled back generation {current.generation}: traffic back to {_describe(routes)} (generation {release.generation})")
    return release


def _nothing_before(model: RegisteredModel, current: Release) -> str:
    if not model.releases.filter(generation__lt=current.generation).exists():
        return f"nothing to roll back to: generation {current.generation} is the first release of {model.name}"
    ended = abort_ended_chain(current)
    if ended:
        return f"nothing to roll back to: {ended}; restore an earlier generation from the history instead"
    return (f"nothing to roll back to: generation {current.generation} ({current.get_action_display().lower()}) "
            "has no earlier routes to return to; restore an earlier generation from the history instead")


def _by_version(route: Route) -> int:
    return route.version


def _same_routes(routes: list[Route], release: Release) -> bool:
    return sorted(routes, key=_by_version) == sorted((Route.from_json(route) for route in release.routes), key=_by_version)


def restore(model: RegisteredModel, generation: int, actor, reason: str = "", *, expected_generation: int | None = None,
            force: bool = False, checked: bool = True) -> Release:
    """``force`` (with a reason) restores routes to a version no worker could load, as a
    split does; ``checked=False`` skips that check for a drill's roll forward, which puts
    back what served before the drill."""
    with transaction.atomic():
        counter = ServingGeneration.objects.lock()
        check_expected_generation(model, model.current_release(), expected_generation)
        check_not_archived(model)
        earlier = model.releases.filter(generation=generation).first()
        if earlier is None:
            raise ReleaseError(f"model {model.name} has no release with generation {generation}")
        if earlier.is_archive:
            raise ReleaseConflict(f"generation {generation} archived {model.name}: archive the model instead of restoring it")
        routes = [Route.from_json(route) for route in earlier.routes]
        current = model.current_release()
        if current is not None and _same_routes(routes, current):
            # As with a split that changes nothing: the new generation would become the
            # rollback point, and the one-click rollback would "return" to what is served.
            raise ReleaseConflict(f"generation {generation} routes what {model.name} serves now "
                                  f"({_describe(routes)}, generation {current.generation}): nothing to restore")
        _check_still_ready(model, [route.version for route in routes])
        unloadable = _unloadable(model, current, routes, force, reason) if checked else []
        worse = evaluated_worse(model, current, _answering(routes)) if checked else []
        note = reason or f"restore of generation {generation}"
        release = _append(counter, model, routes, earlier.stable_version, ReleaseAction.RESTORE, current, actor, note)
        message = f"Restored generation {generation}: traffic {_describe(routes)} (generation {release.generation})"
        if unloadable:
            message += f"; forced although {'; '.join(unloadable)}: {reason}"
        _made(release, message, unloadable, worse)
    return release


def archive_traffic(model: RegisteredModel, actor, reason: str) -> Release | None:
    """Stop serving ``model``: a release with no routes, which keeps the stable version
    and, as rollback target, the release it replaces (what a restore brings back); its
    rollouts are aborted. None when nothing serves the model. Only ``catalog.archive``
    calls it, inside its transaction, which sets the flag under the same lock."""
    counter = ServingGeneration.objects.lock()
    current = model.current_release()
    if current is None or current.is_archive:
        return None
    note = reason or "model archived"
    restored = restored_after_archive(current)  # before the abort below changes the answer
    release = _append(counter, model, [], current.stable_version, ReleaseAction.ARCHIVE, current, actor, note)
    _abort_rollouts(model, release)
    events.release_made(release, f"Archived: {describe_routes(current)} stop serving on every worker (generation {release.generation}); "
                                 f"a restore brings back {restored}")
    return release


def restored_after_archive(current: Release) -> str:
    """What a restore would serve if ``current`` were archived now, in words: its routes,
    or its stable version alone when an active rollout's canary has a share of them (the
    archive aborts the rollout, and an aborted rollout's canary serves nothing)."""
    canaries = versions_receiving(current.routes)
    rollout = current.model.rollouts.filter(status__in=ACTIVE_ROLLOUT_STATUSES, canary_version__in=canaries).first()
    return f"v{rollout.stable_version} 100%" if rollout is not None else describe_routes(current)


def restore_from_archive(model: RegisteredModel, actor, reason: str) -> tuple[Release | None, str]:
    """The routes served before the archive, in a new generation, when every one of
    their versions is still ready; else nothing (the model then serves nothing until a
    version is routed). Returns the release (or None) and what happened, in words."""
    counter = ServingGeneration.objects.lock()
    current = model.current_release()
    if current is None or not current.is_archive:
        return None, "it was never served: it serves nothing until a version becomes ready"
    before = current.rollback_target
    if before is None:
        return None, "the release it served before the archive is gone: it serves nothing until a version is routed"
    routes = [Route.from_json(route) for route in before.routes]
    aborted = _rollout_aborted_by(current, routes)
    if aborted is not None:  # as its abort would have: stable at 100 %, the canary unwatched no more
        routes = [Route(version=aborted.stable_version, weight=100)]
    missing = sorted({route.version for route in routes} - _ready_numbers(model))
    if missing:
        words = f"{_versions_words(missing)} it served before {_are(missing)} no longer ready"
        return None, f"{words}: it serves nothing until a version is routed"
    unloadable = unservable(model, routes)
    if unloadable and before.stable_version not in unloadable:
        # Its canary's stored file changed while archived: the stable alone, as an abort would (an attacker's find).
        routes, dropped = [Route(version=before.stable_version, weight=100)], unloadable
    elif unloadable:
        words = "; ".join(f"v{version}: {why}" for version, why in unloadable.items())
        return None, f"the stable version it served before cannot be served now ({words}): it serves nothing until a version is routed"
    else:
        dropped = {}
    note = reason or f"restored from the archive, back to the routes of generation {before.generation}"
    if aborted is not None or dropped:
        note = reason or f"restored from the archive, back to the stable version of generation {before.generation}"
    # Rolling back from here is what rolling back before the archive would have been.
    release = _append(counter, model, routes, before.stable_version, ReleaseAction.RESTORE, before.rollback_target, actor, note)
    events.release_made(release, f"Restored from the archive: traffic {_describe(routes)} (generation {release.generation})")
    outcome = f"traffic is back to {_describe(routes)} (generation {release.generation})"
    if dropped:
        outcome += ", without " + "; ".join(f"v{version}'s share: {why}" for version, why in dropped.items())
    if aborted is not None:
        outcome += (f", without v{aborted.canary_version}'s share of generation {before.generation}: rollout #{aborted.pk}, "
                    "whose step it was, was aborted by the archive, and an aborted rollout's canary serves nothing")
    return release, outcome


def unservable(model: RegisteredModel, routes, but: int | None = None) -> dict[int, str]:
    """Version → why no worker could serve it (``loadable_problem``), of the versions
    ``routes`` weight other than ``but``, the live workers read once."""
    versions = [route.version for route in routes if route.weight > 0 and route.version != but]
    workers = live_workers_brief() if versions else []
    return {version: why for version in versions if (why := loadable_problem(model, version, workers))}


def _rollout_aborted_by(archive: Release, routes: list[Route]):
    """The rollout the ``archive`` release aborted while its canary had a share of
    ``routes``: restoring that share would serve a canary no analysis watches any more."""
    canaries = [route.version for route in routes if route.receives_requests]
    marks = ("was archived by", f"(generation {archive.generation})")
    for rollout in Rollout.objects.filter(model=archive.model, status=RolloutStatus.ABORTED, canary_version__in=canaries):
        if all(mark in rollout.status_reason for mark in marks):
            return rollout
    return None


def _abort_rollouts(model: RegisteredModel, release: Release) -> None:
    """An archived model has no traffic to roll out on: its rollouts end, and say why."""
    who = release.actor.get_username() if release.actor else "an operator"
    for rollout in Rollout.objects.select_for_update().filter(model=model, status__in=ACTIVE_ROLLOUT_STATUSES):
        rollout.status, rollout.finished_at = RolloutStatus.ABORTED, timezone.now()
        rollout.status_reason = f"aborted: {model.name} was archived by {who} (generation {release.generation}); nothing serves it any more"
        rollout.save(update_fields=["status", "status_reason", "finished_at"])
        events.rollout_event(rollout, release.actor, f"Rollout #{rollout.pk} {rollout.status_reason}", {"event": "aborted", "generation": release.generation})


def route_first_version(version: ModelVersion, actor) -> Release | None:
    """The first ready version of a model becomes its stable route at 100%."""
    with transaction.atomic():
        counter = ServingGeneration.objects.lock()
        # Read under the lock catalog.archive takes: an archived model serves nothing.
        if version.model.releases.exists() or RegisteredModel.objects.filter(pk=version.model_id, archived_at__isnull=False).exists():
            return None
        routes = [Route(version=version.number, weight=100)]
        release = _append(counter, version.model, routes, version.number, ReleaseAction.INITIAL, None, actor, "first ready version")
        events.release_made(release, f"Version {version.number} routed as stable at 100% (generation {release.generation})")
    return release


def check_expected_generation(model: RegisteredModel, current: Release | None, expected_generation: int | None) -> None:
    """Refuse a change decided on an older view of the model; call it under the lock."""
    seen = current.generation if current else 0
    if expected_generation is None or expected_generation == seen:
        return
    raise GenerationConflict(_conflict_message(model, current, expected_generation), expected_generation=expected_generation, current=current)


def _conflict_message(model: RegisteredModel, current: Release | None, expected: int) -> str:
    if current is None:
        return f"{model.name} has no release yet, but the request was made for generation {expected}: nothing changed"
    newer = model.releases.filter(generation__gt=expected).count()
    what = f"generation {current.generation} ({_describe_release(current)})"
    if expected > current.generation:
        return f"{model.name} is at {what}, not generation {expected} as the request says: nothing changed; reload and decide again"
    since = "" if newer == 1 else f", the newest of {newer} changes since then"
    return f"{what}{since} replaced generation {expected} you saw: nothing changed; reload and decide again"


def _describe_release(release: Release) -> str:
    at = timezone.localtime(release.created_at).strftime("%H:%M:%S %Z")
    actor = _actor_name(release)
    return f"{release.get_action_display().lower()}{f' by {actor}' if actor else ''} at {at}"


def _actor_name(release: Release | None) -> str | None:
    if release is None or release.actor is None:
        return None
    return release.actor.get_username()


def _append(counter: ServingGeneration, model, routes: list[Route], stable: int, action: str, rollback_target, actor, reason: str,
            *, rollout: Rollout | None = None) -> Release:
    counter.generation += 1
    counter.save(update_fields=["generation"])
    release = Release.objects.create(
        model=model,
        generation=counter.generation,
        routes=routes_to_json(routes),
        stable_version=stable,
        action=action,
        rollback_target=rollback_target,
        actor=actor if actor is not None and actor.is_authenticated else None,
        reason=reason,
    )
    note_pending(f"{model.name}: generation {release.generation}")
    transaction.on_commit(_publish)
    if rollout is None and action != ReleaseAction.ARCHIVE:
        _pause_rollouts(model, release)
    return release


def _pause_rollouts(model: RegisteredModel, release: Release) -> None:
    """A change no rollout made pauses the model's running rollout, and says so."""
    who = release.actor.get_username() if release.actor else "an operator"
    for rollout in Rollout.objects.select_for_update().filter(model=model, status__in=ANALYSED_ROLLOUT_STATUSES):
        rollout.status = RolloutStatus.PAUSED
        rollout.status_reason = (f"paused: manual traffic change by {who} (generation {release.generation}, "
                                 f"{release.get_action_display().lower()}); resume to set step {rollout.step_index + 1} again")
        rollout.save(update_fields=["status", "status_reason"])
        events.rollout_event(rollout, release.actor, f"Rollout #{rollout.pk} {rollout.status_reason}", {"event": "paused", "generation": release.generation})


class CanaryNotLoaded(ReleaseConflict):
    """A promote of a version the live workers failed to load, not forced. ``refusal`` is
    what is wrong; the message adds how an API client forces it (the console names its own
    Force control instead)."""

    def __init__(self, version: int, why: str, verb: str):
        self.refusal = f"v{version} not {verb}: {why}; the workers would go on serving what they serve now"
        super().__init__(f"{self.refusal}. Mend or replace the version, or send force: true with a reason to do it anyway")


def check_loadable(model: RegisteredModel, version: int, force: bool, reason: str, *, verb: str = "promoted", workers=None) -> str | None:
    """Refused unless ``force`` with a reason: promoting a version the live workers failed
    to load. An operator's run promoted one (201, no word of warning): the page read "v3
    100 %" while every worker went on answering with v1 and v2. Returns why it is forced
    (None: nothing to force), for the audit."""
    why = loadable_problem(model, version, workers)
    if why is None:
        return None
    if not force:
        raise CanaryNotLoaded(version, why, verb)
    if not has_visible_text(reason):
        raise ReleaseError(f"force needs a reason: say why v{version}, which no live worker could load, is {verb}")
    return why


def loadable_problem(model: RegisteredModel, version: int, workers=None, row: ModelVersion | None = None) -> str | None:
    """Why no worker would serve ``version`` if routed (what ``check_loadable`` refuses);
    ``workers``: the live workers, and ``row`` the version's, when the caller has read them
    (a page asking of every version made a query each)."""
    return load_failure(model.name, version, workers) or _stored_file_problem(model, version, row)


def restore_unloadable(model: RegisteredModel, earlier: Release) -> list[str]:
    """What a restore of ``earlier`` would be refused for unless forced: the page's
    confirmation shows it beside its Force control."""
    current = model.current_release()
    if current is None:
        return []
    return [f"v{version}: {why}" for version, why in unservable(model, map(Route.from_json, earlier.routes), but=current.stable_version).items()]


def _stored_file_problem(model: RegisteredModel, version: int, row: ModelVersion | None = None) -> str | None:
    """What the console itself knows is wrong with the version's stored file: the workers'
    load errors are forgotten once they apply another state (an attacker's split to a
    version whose file was changed then went through unforced)."""
    stored = (row.sha256, row.size_bytes) if row is not None else model.versions.filter(number=version).values_list("sha256", "size_bytes").first()
    return served_bytes.stored_file_problem(storage.path_for(stored[0]), stored[1]) if stored else None


def _unloadable(model: RegisteredModel, current: Release | None, routes: list[Route], force: bool, reason: str) -> list[str]:
    """``check_loadable`` of every version ``routes`` weight other than the current stable."""
    candidates = [] if current is None else [route.version for route in routes if route.weight > 0 and route.version != current.stable_version]
    if not candidates:
        return []
    workers = live_workers_brief()  # read once for every route (forged workers' rows made each change slow)
    return [why for version in candidates if (why := check_loadable(model, version, force, reason, verb="routed", workers=workers))]


def check_compatible(model: RegisteredModel, current: Release | None, routes: list[Route], force: bool, reason: str) -> list[str]:
    """The differences of every newly weighted version whose inputs differ from the
    current stable's; refused unless ``force`` with a reason. [] when all are compatible."""
    if current is None:
        return []
    candidates = [route.version for route in routes if route.weight > 0 and route.version != current.stable_version]
    if not candidates:
        return []
    versions = {version.number: version for version in model.versions.filter(number__in=[current.stable_version, *candidates])}
    stable = versions.get(current.stable_version)
    differences = [f"v{number}: {difference}" for number in candidates if stable is not None and number in versions
                   for difference in input_differences(stable.signature, versions[number].signature, stable_version=stable.number)]
    if not differences:
        return []
    if not force:
        raise IncompatibleInputs(current.stable_version, differences)
    if not has_visible_text(reason):
        raise ReleaseError("force needs a reason: say why traffic goes to a version with incompatible inputs")
    return differences


def _publish() -> None:
    # Imported here: publishing needs the channel layer, which the module's pure
    # checks do not; a failed publish is only logged because workers reconcile.
    from registry.fleet.publish import publish_desired_state

    publish_desired_state()


def check_not_archived(model: RegisteredModel) -> None:
    if RegisteredModel.objects.filter(pk=model.pk, archived_at__isnull=False).exists():
        raise ReleaseConflict(f"{model.name} is archived: restore it from the archive before routing traffic to it")


def _ready_numbers(model: RegisteredModel) -> set[int]:
    return set(model.versions.ready().values_list("number", flat=True))


def version_not_ready(model: RegisteredModel, number: int) -> str:
    """Why version ``number`` of ``model`` takes no traffic: "does not exist or is not
    ready" sent a newcomer looking for a version that was still being validated."""
    return not_ready_words(number, model.versions.filter(number=number).values_list("status", flat=True).first())


def _not_ready(model: RegisteredModel, numbers) -> str | None:
    """Why ``numbers`` cannot be routed now, or None when every one is ready."""
    missing = sorted(set(numbers) - _ready_numbers(model))
    return f"{_versions_words(missing)} of {model.name} {_are(missing)} no longer ready (archived or rejected)" if missing else None


def _versions_words(numbers: list[int]) -> str:
    """"v2", "v1 and v2", "v1, v2 and v3": operators read these, not a Python list."""
    names = [f"v{number}" for number in numbers]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _are(numbers: list[int]) -> str:
    return "is" if len(numbers) == 1 else "are"


def _check_still_ready(model: RegisteredModel, numbers: list[int]) -> None:
    refusal = _not_ready(model, numbers)
    if refusal:
        raise ReleaseConflict(refusal)


def require_current(model: RegisteredModel) -> Release:
    current = model.current_release()
    if current is None:
        raise ReleaseConflict(f"model {model.name} has no release yet: upload a version first")
    return current


def _stable_for(routes: list[Route], current: Release | None) -> int:
    """A single route at 100% is the new stable; a split keeps the current stable."""
    weighted = [route for route in routes if route.weight > 0]
    if len(weighted) == 1:
        return weighted[0].version
    if current is None or current.stable_version not in {route.version for route in weighted}:
        stable = "none" if current is None else f"version {current.stable_version}"
        raise ReleaseError(f"a canary needs a stable: a split must include the current stable ({stable}) with a weight above 0")
    return current.stable_version


def _only_canary(current: Release) -> int:
    canaries = [route["version"] for route in current.routes if route["weight"] > 0 and route["version"] != current.stable_version]
    if not canaries:
        raise ReleaseConflict(f"nothing to promote: generation {current.generation} routes only the stable version {current.stable_version}")
    if len(canaries) > 1:
        raise ReleaseConflict(f"more than one canary ({canaries}); set the routes explicitly")
    return canaries[0]


def _describe(routes: list[Route]) -> str:
    return ", ".join(route.describe() for route in routes)


def describe_routes(release: Release) -> str:
    """What ``release`` routes, in words ("v1 90%, v2 10%"), as answers and drills say it."""
    if release.is_archive:
        return "nothing (archived)"
    return _describe([Route.from_json(route) for route in release.routes])
