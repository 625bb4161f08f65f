"""Rollback drills: a timed rollback, measured from the operator's click to every
participating worker acking and serving the restored state, with the failed requests
counted. The participants are the live workers and those that went silent shortly before
the drill (``drill_workers``): a frozen worker still holds its port, so it must follow too.

The drill measures for DRILL_ACK_TIMEOUT_S from the click and no longer, so the target it
judges and reports is DRILL_TARGET_S or that wait, whichever is shorter (``drill_target_s``):
a worker that follows after the wait is never seen, whatever DRILL_TARGET_S says. Its roll
forward then waits up to as long again for acks, so its HTTP request takes at most twice
DRILL_ACK_TIMEOUT_S (and what an outage adds, ``through_outage``).

The drill sends no HTTP request: a worker's URL is whatever it reported, and following
it would let anyone holding the worker token point the console at internal hosts. What
the console trusts instead is what it checks: acks (stored only when they name a state
it issued) and reports (the generation, digest and failure counter a worker serves).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction
from django.utils import timezone

from registry import process_stop
from registry.actions import events, releases, stale_drills
from registry.db_unavailable import is_database_unavailable
from registry.domain.choices import ANALYSED_ROLLOUT_STATUSES, DrillStatus, RolloutStatus
from registry.fleet.state import issued_digest
from registry.fleet.workers import (
    GONE_LISTED_FOR,
    RECENTLY_SILENT_S,
    SAID_STOPPED,
    SHOWN_ERROR_CHARS,
    IssuedDigests,
    failed_to_apply,
    gone_workers,
    lifecycle,
    serves_issued_model,
)
from registry.models import (
    Drill,
    RegisteredModel,
    Release,
    Rollout,
    ServingGeneration,
    Worker,
    WorkerAck,
)
from serving.contract import MAX_COUNT, models_not_applied

logger = logging.getLogger(__name__)
POLL_S = 0.05
# A worker whose last report came less than RECENTLY_SILENT_S (registry.fleet.workers)
# before the drill is one of its participants even when it is "gone": an operator found a
# drill passing because a worker froze 5.1 s before it (4.9 s: failed). A fixed minute,
# not a multiple of DRILL_TARGET_S or DRILL_ACK_TIMEOUT_S, which may be set to a fraction
# of a second: the question is how long a silent worker may still be serving.
# A drill's wait overrunning DRILL_ACK_TIMEOUT_S by more than this was the console's own
# stall, not a slow poll (POLL_S) or a slow query.
CONSOLE_STALL_SLACK_S = 2.0
# Workers gone longer than RECENTLY_SILENT_S are not measured, and the drill's note names
# those gone within the Workers page's window (GONE_LISTED_FOR), so each one named can
# still be found there; older ones, usually dead ids of restarted workers, were named in
# every drill until retention forgot them (a day).
GONE_NOTED_FOR = GONE_LISTED_FOR
# Silent workers a drill's dialog names; the rest it counts.
SILENT_NAMED = 16
# A drill the console is stopped during (registry.process_stop): said as the sweep says
# of a drill it abandons ("abandoned: the console stopped during the drill …").
CONSOLE_STOPPED = "the console stopped during the drill"
UNHEARD = "not seen: the console stopped taking reports and acks"


def run_drill(model: RegisteredModel, actor, *, roll_forward: bool = True, expected_generation: int | None = None,
              made: Callable[[str], None] = lambda change: None) -> Drill:
    """Always returns a finished drill (passed or failed, with the reason), or raises the
    ReleaseError that made the drill impossible (another drill running, a stale view,
    nothing to roll back to; after the row exists it is recorded as error).

    ``made(change)`` is told, in words, what the drill has committed so far, from the
    moment its rollback commits: a database outage after that raises out of here with
    the rollback in force, and the caller's answer must say it was made, not "retry"."""
    # Timed from here, before any lock is waited for: started after the wait, a drill whose
    # rollback waited 5.6 s on a locked table reported 1.0 s and passed.
    clicked_at = timezone.now()
    workers, silent_s, gone = drill_workers()
    running_rollout = model.rollouts.filter(status__in=ANALYSED_ROLLOUT_STATUSES).first()  # waiting for data too: its rollback pauses it as well
    drill, release = _start(model, actor, roll_forward, expected_generation, clicked_at)
    failed_before = {worker.worker_id: failed_total(worker.last_report) for worker in workers}
    made(made_so_far(drill, recorded=False))
    window = RollbackWindow(release)
    try:
        drill.to_digest = issued_digest(release.generation) or ""
        rows, stopped_s = _measure(drill, workers, release, failed_before, window, silent_s)
        _judge(drill, rows, stopped_s, window)
        if gone:  # not measured: a drill says so, never passes over them in silence
            drill.not_measured = gone
            _add_reason(drill, f"not measured: {_workers(len(gone))} gone before the drill (last report between "
                               f"{RECENTLY_SILENT_S:g} s and {_duration(GONE_NOTED_FOR)} before it): {', '.join(gone)}")
        _note_uncounted_requests(drill)
        _note_silent_workers(drill)
        _note_other_models(drill)
        _note_console_stall(drill)
    except Exception as error:
        drill.workers, drill.status = [], DrillStatus.FAILED
        if is_database_unavailable(error):
            logger.warning("drill #%s: the database became unavailable while it was measured: %s", drill.pk, error)
            drill.error = "the database became unavailable during the drill, so it could not be measured"
        else:
            logger.exception("drill #%s could not be measured", drill.pk)
            drill.error = f"the drill could not be measured: {error}"[:SHOWN_ERROR_CHARS]
    through_outage(lambda: _record_end(drill), f"drill #{drill.pk}: recording its end")
    made(made_so_far(drill, recorded=True))
    if roll_forward:
        through_outage(lambda: _roll_forward(drill, model, actor, workers), f"drill #{drill.pk}: rolling forward")
        made(made_so_far(drill, recorded=True))
    if running_rollout is not None:
        through_outage(lambda: _note_paused_rollout(drill, running_rollout), f"drill #{drill.pk}: reading its model's rollout")
    _log_result(drill)
    return drill


def _log_result(drill: Drill) -> None:
    """The console's log said nothing of a drill's result: only its page and API did."""
    passed = drill.status == DrillStatus.PASSED and not drill.forward_unconfirmed and not drill.not_measured
    logger.log(logging.INFO if passed else logging.WARNING, "drill #%s of %s %s (generation %s to %s)%s", drill.pk, drill.model.name,
               drill.status, drill.from_generation, drill.to_generation, f": {drill.error}" if drill.error else "")


def drill_workers(now=None) -> tuple[list[Worker], dict[str, float], list[str]]:
    """Who a drill starting ``now`` measures, and what it says of the others:
    (participants, seconds each silent one had been silent, ids of the gone ones it
    names as not measured). Participants are the live workers and those silent for less
    than RECENTLY_SILENT_S; a worker whose last report said it stopped never is one (it
    answered everything it accepted and exited). Read in one query, so a worker that
    reports meanwhile is neither counted twice nor missed."""
    now = now or timezone.now()
    since = now - timedelta(seconds=max(RECENTLY_SILENT_S, settings.WORKER_GONE_AFTER_S))
    workers = list(Worker.objects.filter(last_seen_at__gte=since).exclude(SAID_STOPPED))
    silent_s = {worker.worker_id: (now - worker.last_seen_at).total_seconds() for worker in workers if lifecycle(worker, now) == "gone"}
    noted = gone_workers().filter(last_seen_at__lt=since, last_seen_at__gte=now - GONE_NOTED_FOR)
    return workers, silent_s, list(noted.values_list("worker_id", flat=True))


def silent_participants(now=None) -> tuple[list[dict], int]:
    """The workers a drill starting ``now`` would wait for though they are not reporting
    (silent for less than RECENTLY_SILENT_S, as ``drill_workers`` counts them): the first
    SILENT_NAMED as [{"worker_id", "silent_s"}], longest silent first, and how many more.
    The drill's dialog names them: it said it measures "every live worker", then failed on
    a worker killed 25 s before the click. Two columns of at most SILENT_NAMED rows, since
    the model page asks at each refresh and any worker token can make up ids."""
    now = now or timezone.now()
    since = now - timedelta(seconds=max(RECENTLY_SILENT_S, settings.WORKER_GONE_AFTER_S))
    silent = Worker.objects.filter(last_seen_at__gte=since, last_seen_at__lt=now - timedelta(seconds=settings.WORKER_GONE_AFTER_S)).exclude(SAID_STOPPED)
    named = [{"worker_id": worker_id, "silent_s": round((now - seen).total_seconds())}
             for worker_id, seen in silent.order_by("last_seen_at", "worker_id").values_list("worker_id", "last_seen_at")[:SILENT_NAMED]]
    # Two reads: a named worker that reports between them leaves the count short of the names.
    return named, (max(0, silent.count() - len(named)) if len(named) == SILENT_NAMED else 0)


def drill_target_s() -> float:
    """The time within which every worker must follow: DRILL_TARGET_S, but no longer than
    the drill waits (DRILL_ACK_TIMEOUT_S), since nothing after the wait is seen; a target
    of 60 s beside a wait of 10 s failed a worker following in 12 s as "no ack"."""
    return min(settings.DRILL_TARGET_S, settings.DRILL_ACK_TIMEOUT_S)


def _workers(count: int) -> str:
    return f"{count} worker{'' if count == 1 else 's'}"


def _duration(span: timedelta) -> str:
    seconds = span.total_seconds()
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds:g} s"


def made_so_far(drill: Drill, *, recorded: bool) -> str:
    """What ``drill`` has committed, for an answer an outage cuts short: its rollback is
    in force whatever fails next, and its end and roll forward are said only once made."""
    words = f"{drill.model.name}: drill #{drill.pk} rolled back to generation {drill.to_generation}"
    later = (f"the console makes it once its database answers ({stale_drills.longest_drill_s():g} s after the drill started "
             f"at the earliest), unless {drill.model.name} is changed first")
    if not recorded:
        owed = f" and it was not rolled forward yet: {later}" if drill.roll_forward else ""
        return f"{words}; the drill's result could not be recorded{owed}"
    words = f"{words}, recorded as {drill.status}"
    if drill.forward_generation is not None:
        return f"{words}, rolled forward to generation {drill.forward_generation}"
    if not drill.roll_forward or not drill.forward_pending:  # not asked, or ruled out (the summary says why)
        return f"{words}; not rolled forward"
    return f"{words}; its roll forward may not have been made: if not, {later}"


def through_outage(step, what: str):
    """``step()``, tried again while the database is unreachable, for up to
    DRILL_ACK_TIMEOUT_S: a drill that already rolled back must record its end and roll
    forward once the database answers, not leave the rollback in force. A step is tried
    again from its start, so each must find what an earlier try committed (``_roll_forward``
    finds its own release) rather than repeat or misread it."""
    deadline, pause_s = time.monotonic() + settings.DRILL_ACK_TIMEOUT_S, 0.1
    while True:
        try:
            return step()
        except DatabaseError as error:
            if not is_database_unavailable(error) or time.monotonic() + pause_s > deadline:
                raise
            logger.warning("%s: the database is unavailable, trying again in %.1f s: %s", what, pause_s, error)
        close_old_connections()  # the broken connection goes; the next query opens a new one
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, 1.0)


class RollbackWindow:
    """The generations in which a drill's rollback is in force: from its release to the
    next release of the same model, if one landed (looked up again on every call, since
    an operator may change the model while the drill runs)."""

    def __init__(self, release: Release):
        self.release = release

    def end(self) -> int | None:
        later = Release.objects.filter(model_id=self.release.model_id, generation__gt=self.release.generation)
        return later.order_by("generation").values_list("generation", flat=True).first()

    def holds(self, generation: int, end: int | None) -> bool:
        return generation >= self.release.generation and (end is None or generation < end)


def _start(model: RegisteredModel, actor, roll_forward: bool, expected_generation: int | None, clicked_at) -> tuple[Drill, Release]:
    """The drill row and its rollback, in one transaction under the generation lock: one
    running drill per model, and its ``from_generation`` is what the model serves at that
    instant and what is rolled back. An outage before the COMMIT leaves neither (the
    plain 503 to retry, and a retry finds no drill running); a lost COMMIT is in doubt
    (the rollback noted itself pending). A rollback refused (nothing to roll back to) is
    committed as a drill recorded as error, and its ReleaseError raised."""
    refused = None
    _settle_owed_roll_forward(model)
    with transaction.atomic():
        ServingGeneration.objects.lock()
        # A drill running says more than "the generation you saw changed": its own
        # rollback is that change, so two drills started together meet this first.
        running = model.drills.filter(status=DrillStatus.RUNNING).first()
        if running is not None:
            raise DrillRunning(f"drill #{running.pk} on {model.name} is still running (started {running.started_at:%H:%M:%S} UTC): one drill at a time")
        # Nor over a drill whose roll forward is owed: this one's rollback and roll forward
        # would come between, and the owed roll forward, refused over them, never made.
        owing = stale_drills.owing_drills(model).first()
        if owing is not None:
            due = owing.started_at + timedelta(seconds=stale_drills.longest_drill_s())
            raise DrillRunning(f"drill #{owing.pk} on {model.name} has not rolled forward yet: the console settles it from {due:%H:%M:%S} "
                               f"UTC (rolls it forward, or says why not if {model.name} was changed since); one drill at a time")
        current = model.current_release()
        releases.check_expected_generation(model, current, expected_generation)
        releases.check_not_archived(model)
        drill = Drill.objects.create(
            model=model, actor=actor if actor.is_authenticated else None, started_at=clicked_at,
            target_s=drill_target_s(), roll_forward=roll_forward, from_generation=current.generation if current else None,
            forward_pending=roll_forward,
        )
        try:
            # Under the same lock: the generation just read is the one rolled back.
            release = releases.rollback(model, actor, f"rollback drill #{drill.pk}", expected_generation=drill.from_generation or 0)
        except releases.ReleaseError as error:  # its savepoint is undone; the drill is kept, as error
            drill.forward_pending = False  # nothing was rolled back
            _finish(drill, DrillStatus.ERROR, error=error.message)
            refused = error
        else:
            drill.to_generation = release.generation
            drill.save(update_fields=["to_generation"])
    if refused is not None:
        raise refused
    return drill, release


class DrillRunning(releases.ReleaseConflict):
    """Another drill of the same model has not finished."""


def _settle_owed_roll_forward(model: RegisteredModel) -> None:
    """Before a drill starts: the roll forward a stale drill of ``model`` still owes is
    settled in its own transaction. One made is a change the operator did not see, so the
    drill is refused (409, saying so) rather than run from a state other than the one the
    operator chose it on; the console's drill form sent the generation it showed, and
    was told "nothing changed"."""
    stale_drills.abandon_stale_drills(model)
    made = [drill for drill in stale_drills.roll_forward_owed(model) if drill.forward_generation is not None]
    if made:
        words = ", ".join(f"drill #{drill.pk}'s (generation {drill.forward_generation})" for drill in made)
        raise releases.ReleaseConflict(f"{model.name} was rolled forward just now by the console: {words}, owed since an outage or a "
                                       "console stop cut the drill short; look at what it serves now and run the drill again from there")


def failed_total(report: object) -> int | None:
    """Requests the worker answered with a server-side failure since it started, as reported."""
    value = report.get("requests_failed_total") if isinstance(report, dict) else None
    # Past MAX_COUNT (a report stored before the contract bounded it): unknown, not a count.
    return value if type(value) is int and 0 <= value <= MAX_COUNT else None


def failed_sum(counts) -> int:
    """Failed requests of several workers together, at most MAX_COUNT: what
    ``Drill.failed_requests`` holds. Each worker's count is the contract's, but a sum is
    not: a worker token's holder reporting 2**40 failures made the drill's write fail
    (PostgreSQL's integer column then), the drill answered 500 and stayed running with
    its rollback in force and its roll forward not made."""
    return min(sum(counts), MAX_COUNT)


def _measure(drill: Drill, workers: list[Worker], release: Release, failed_before: dict, window: RollbackWindow,
             silent_s: dict[str, float]) -> tuple[list[dict], float | None]:
    """Each worker's row, and when the console began to stop if it did before the measure
    ended (seconds from the click): the rows were judged against that moment."""
    # The wait runs from the click, as ack_s and the target do: a wait from here would
    # see acks up to the rollback's own duration past the target it reports.
    deadline = time.monotonic() + settings.DRILL_ACK_TIMEOUT_S - max(_since(drill, timezone.now()), 0.0)
    acks, confirmed = watch_workers(drill, [worker.worker_id for worker in workers], window, deadline)
    # Of every worker, confirmed or not: one killed after it confirmed left its last count
    # standing, and a drill passed with "0 failed" while its clients were refused (381 times).
    quiet = _quiet_since(drill, [worker.worker_id for worker in workers], settings.WORKER_GONE_AFTER_S / 2)
    # Failures counted to the end of the measure: a worker's row read 0 from the report
    # that confirmed it while its later report counted 29 503s (an operator's fault run).
    latest = dict(Worker.objects.filter(worker_id__in=[worker.worker_id for worker in workers]).values_list("worker_id", "last_report"))
    stopped_s = _console_stopped_s(drill)
    return [_worker_row(drill, worker, acks.get(worker.worker_id), confirmed.get(worker.worker_id), failed_before,
                        silent_s.get(worker.worker_id), quiet.get(worker.worker_id), latest.get(worker.worker_id), stopped_s)
            for worker in workers], stopped_s


def _console_stopped_s(drill: Drill) -> float | None:
    """Seconds from the click to the moment this console process began to stop (it hears
    no worker after that: ``registry.process_stop``); None while it runs."""
    began_at = process_stop.began_at()
    return None if began_at is None else max(_since(drill, began_at), 0.0)


def _heard_until():
    """The last moment a worker's report or ack could reach this process: now, or when it
    began to stop. A worker is quiet only if it was quiet while the console could hear it."""
    return process_stop.began_at() or timezone.now()


def _stopped_reporting(drill: Drill, worker_ids: list[str]) -> dict[str, float]:
    """Of ``worker_ids``, those whose reports stopped (none for WORKER_GONE_AFTER_S by now):
    seconds from the click to their last report. "No ack before the timeout" of a worker
    killed just after the click read as a slow worker, and one killed just after its ack
    was waited for again by the roll forward."""
    return {worker_id: last_s for worker_id, (last_s, _) in _quiet_since(drill, worker_ids, settings.WORKER_GONE_AFTER_S).items()}


def _quiet_since(drill: Drill, worker_ids: list[str], quiet_s: float) -> dict[str, tuple[float, float]]:
    """Of ``worker_ids``, those with no report for ``quiet_s`` by now: (seconds from the
    click to their last report, seconds since it)."""
    if not worker_ids:
        return {}
    now = _heard_until()
    seen = Worker.objects.filter(worker_id__in=worker_ids, last_seen_at__lt=now - timedelta(seconds=quiet_s))
    return {worker_id: (_since(drill, last_seen_at), (now - last_seen_at).total_seconds())
            for worker_id, last_seen_at in seen.values_list("worker_id", "last_seen_at")}


def _quiet_words(last_s: float, age_s: float) -> str:
    """Killed within WORKER_GONE_AFTER_S of the timeout, a worker is not yet gone when the
    measure ends, and its row read like a slow worker's: it says how long it has been quiet."""
    when = f"{last_s:.1f} s after the click" if last_s >= 0 else f"{-last_s:.1f} s before the click"
    if age_s >= settings.WORKER_GONE_AFTER_S:
        return f"it stopped reporting (its last report came {when})"
    return f"it has not reported for {age_s:.1f} s (its last report came {when})"


def _restart_words(pid_before: int | None, *reports: dict | None) -> str:
    """"pid A → B" when a report since the drill began came from another process than the
    one reporting before it (the worker was restarted under its id), else ""."""
    for report in reports:
        identity = report.get("worker") if isinstance(report, dict) else None
        pid = identity.get("pid") if isinstance(identity, dict) else None
        if type(pid) is int and pid_before is not None and pid != pid_before:
            return f"pid {pid_before} → {pid}"
    return ""


def _worker_row(drill: Drill, worker: Worker, ack: WorkerAck | None, confirmed: tuple | None, failed_before: dict,
                silent_s: float | None = None, quiet: tuple[float, float] | None = None, latest_report: dict | None = None,
                stopped_s: float | None = None) -> dict:
    """``stopped_s``: when the console began to stop, from the click, if it did (a worker
    not seen to follow by then is not blamed: nothing it sent could reach the console)."""
    confirmed_s, report = confirmed or (None, None)
    after = failed_total(report)  # unconfirmed: None, its count unknown
    if after is not None and failed_total(latest_report) is not None:
        # The larger: a worker restarted after it confirmed counts from 0 again.
        after = max(after, failed_total(latest_report))
    before = failed_before.get(worker.worker_id)
    restarted = _restart_words(worker.pid, report, latest_report)
    went_quiet = _quiet_words(*quiet) if confirmed_s is not None and quiet is not None else ""
    if restarted or went_quiet:  # a new count from 0, or none since: what failed meanwhile is unknown
        before = None
    error = _row_error(ack, confirmed_s, drill.to_generation, drill.model.name, stopped_s)
    if error and quiet is not None and silent_s is None:  # a silent one's silence is said below
        error = f"{error}: {_quiet_words(*quiet)}"
    if error and silent_s is not None:  # the likely cause, said where the failure is
        error = f"silent {silent_s:.1f} s before the drill; {error}"
    return {
        "worker": worker.worker_id,
        "ack_s": _since(drill, ack.received_at) if ack else None,
        "ok": ack.ok if ack else None,
        "error": error,
        # Followed, but the worker's own words on the rest of the state it failed to apply.
        "note": failed_to_apply(ack.error) if confirmed_s is not None and ack and not ack.ok else "",
        "confirmed_s": confirmed_s,
        # Seconds since its last report when the drill started; null for a live worker.
        "silent_before_s": None if silent_s is None else round(silent_s, 1),
        # What the confirming report said it serves: the issued content, by digest (of the
        # whole state, or of the model's entry where another model fails on the worker).
        "generation": report.get("generation") if report else None,
        "digest": report.get("digest") if report else None,
        "model_digest": _model_digest(report, drill.model.name),
        "failed_requests": None if before is None or after is None else max(after - before, 0),
        # A new process under the same id since the drill began: "pid 31186 → 31983".
        "restarted": restarted,
        # Confirmed, then silent to the measure's end: "it stopped reporting (…)".
        "quiet_after_confirming": went_quiet,
    }


def watch_workers(drill: Drill, worker_ids: list[str], window: RollbackWindow, deadline: float) -> tuple[dict, dict]:
    """Each worker's ack (``latest_acks``) and, once it acked, when a report first showed it
    serving the model as this console issued it in a state in which the rollback is in
    force (seconds since the click, and that report), watched together until every worker
    has both or the deadline: a worker that never answers does not delay the others'
    figures. A worker that applied the state but for another model (its ack not ok) is
    confirmed by the model's own digest: one model's broken canary holds no other's drill."""
    acks: dict[str, WorkerAck] = {}
    found: dict[str, tuple[float, dict]] = {}
    digests, model = IssuedDigests(), window.release.model.name
    while True:
        # Read once more after the console began to stop, then end: nothing else will come.
        stopping = process_stop.began_at() is not None
        end = window.end()
        latest_acks(acks, worker_ids, window, end)
        waiting = [worker_id for worker_id in acks if worker_id not in found]
        for worker in Worker.objects.filter(worker_id__in=waiting):
            report = worker.last_report
            served = report.get("generation") if isinstance(report, dict) else None
            if type(served) is int and window.holds(served, end) and serves_issued_model(report, served, model, digests):
                found[worker.worker_id] = (_since(drill, timezone.now()), report)
        if len(found) == len(worker_ids) or time.monotonic() >= deadline or stopping:
            return acks, found
        time.sleep(POLL_S)


def latest_acks(acks: dict[str, WorkerAck], worker_ids: list[str], window: RollbackWindow, end: int | None) -> None:
    """Update ``acks``: each worker's first ok ack of a state in which the rollback is in
    force, else its failed one (a worker whose retry applied the state has followed)."""
    for ack in WorkerAck.objects.filter(worker_id__in=worker_ids, generation__gte=window.release.generation).order_by("received_at"):
        if window.holds(ack.generation, end) and (ack.worker_id not in acks or ack.ok and not acks[ack.worker_id].ok):
            acks[ack.worker_id] = ack


def wait_for_acks(worker_ids: list[str], window: RollbackWindow, deadline: float,
                  gone: Callable[[list[str]], object] = lambda worker_ids: ()) -> dict[str, WorkerAck]:
    """``latest_acks`` until every worker acked the window's model applied, or is among
    ``gone`` (its reports stopped: no ack will come), or the deadline, or the console
    began to stop (no ack can reach it)."""
    acks: dict[str, WorkerAck] = {}
    model = window.release.model.name
    while True:
        stopping = process_stop.began_at() is not None
        latest_acks(acks, worker_ids, window, window.end())
        waiting = [worker_id for worker_id in worker_ids if not (worker_id in acks and applied(acks[worker_id], model))]
        if not waiting or time.monotonic() >= deadline or stopping or set(waiting) <= set(gone(waiting)):
            return acks
        time.sleep(POLL_S)


def applied(ack: WorkerAck, model: str) -> bool:
    """The ack says ``model``'s part of the state applied: all of it did, or all but other
    models (a worker with another model's canary broken follows a roll forward too)."""
    if ack.ok:
        return True
    others = models_not_applied(ack.error)
    return bool(others) and model not in others


def _row_error(ack: WorkerAck | None, confirmed_s: float | None, generation: int, model_name: str, stopped_s: float | None = None) -> str:
    if confirmed_s is not None:
        return ""  # its report served the model as issued, whatever else failed there (_note_other_models)
    if stopped_s is not None and (ack is None or applied(ack, model_name)):  # one that failed to apply it said so itself
        awaited = "its ack came" if ack is None else f"a report showed it serving generation {generation}"
        partly = "" if ack is None or ack.ok else f" (its ack: {failed_to_apply(ack.error)})"
        return f"{UNHEARD} {stopped_s:.1f} s after the click, before {awaited}{partly}"
    if ack is None:
        return "no ack before the timeout"
    others = models_not_applied(ack.error) if not ack.ok else None
    if others and model_name not in others:
        # "failed to apply" read as "the rollback never reached the workers", where it served at once.
        return (f"applied generation {generation} but for {', '.join(others)}, which fail{'s' * (len(others) == 1)} on it, "
                f"and no report proved {model_name} served as issued (by its digest) before the timeout "
                f"({ack.error[ack.error.index('): ') + 3:][:SHOWN_ERROR_CHARS]})")
    if not ack.ok:
        return failed_to_apply(ack.error)
    if confirmed_s is None:
        # "or later" was read as any later generation: one that replaced the rollback does not count.
        return f"acked, but no report showed it serving generation {generation} (or a later state that kept the rollback) before the timeout"
    return ""


def _judge(drill: Drill, rows: list[dict], stopped_s: float | None, window: RollbackWindow) -> None:
    """The drill's figures and verdict, in memory: ``_finish`` writes them."""
    drill.workers = rows
    ack_times = [row["ack_s"] for row in rows if row["ack_s"] is not None]
    confirmed = [row["confirmed_s"] for row in rows]
    failures = [row["failed_requests"] for row in rows if row["failed_requests"] is not None]
    drill.first_ack_s = min(ack_times) if ack_times else None
    drill.last_ack_s = max(ack_times) if len(ack_times) == len(rows) and rows else None
    drill.confirmed_s = max(confirmed) if rows and all(value is not None for value in confirmed) else None
    # Unknown for one worker, unknown in all: a sum of the known ones read as the total.
    drill.failed_requests = failed_sum(failures) if len(failures) == len(rows) else None
    reasons = failure_reasons(drill, rows, replaced_at=window.end(), stopped_s=stopped_s)
    drill.status, drill.error = (DrillStatus.FAILED if reasons else DrillStatus.PASSED), "; ".join(reasons)


def failure_reasons(drill: Drill, rows: list[dict], replaced_at: int | None = None, stopped_s: float | None = None) -> list[str]:
    """Every reason the drill failed, in words an operator reads in the summary alone;
    empty when it passed. ``replaced_at``: the generation of a later change of the model
    that ended the rollback's window, if one landed; ``stopped_s``: when the console began
    to stop, if it did before every worker was seen to follow."""
    if not rows:
        return ["no live workers to follow the rollback"]
    reasons = []
    unconfirmed = [row for row in rows if row["confirmed_s"] is None]
    if stopped_s is not None and unconfirmed:
        # Not the workers' failure: the console closed its socket (a normal stop), and what
        # they sent since reached nothing. One that failed to apply it is still named below
        # (``_row_error`` words the rows of the unheard).
        unheard = [row for row in unconfirmed if UNHEARD in row["error"]]
        unconfirmed = [row for row in unconfirmed if UNHEARD not in row["error"]]
        if unheard:
            reasons.append(console_stopped_words(drill, rows, unheard, stopped_s))
    if unconfirmed:
        who = ", ".join(f"{row['worker']} ({row['error']})" for row in unconfirmed)
        reasons.append(f"{len(unconfirmed)} of {len(rows)} workers never confirmed serving generation {drill.to_generation}: {who}")
        if replaced_at is not None:
            reasons.append(f"another change of {drill.model.name} (generation {replaced_at}) replaced the rollback during the drill; "
                           "a worker that went straight to it never served the rollback")
    restarted = [row for row in rows if row.get("restarted")]
    if restarted:
        # Killed and started again under its id, a worker confirmed from its new process and
        # its failure count began again at 0: the drill passed with "0 failed" while its
        # clients met a closed port for the restart (595 refused connections in a fault run).
        who = ", ".join(f"{row['worker']} ({row['restarted']})" for row in restarted)
        reasons.append(f"{len(restarted)} of {len(rows)} workers restarted during the drill: {who}; "
                       "requests sent to them meanwhile failed uncounted")
    went_quiet = [row for row in rows if row.get("quiet_after_confirming")]
    if went_quiet:
        who = ", ".join(f"{row['worker']} ({row['quiet_after_confirming']})" for row in went_quiet)
        reasons.append(f"{len(went_quiet)} of {len(rows)} workers fell silent after confirming the rollback: {who}; "
                       "requests sent to them since may have failed uncounted")
    slow = [row for row in rows if row["ack_s"] is not None and row["ack_s"] > drill.target_s]
    if slow:
        who = ", ".join(f"{row['worker']} {row['ack_s']:.2f} s" for row in slow)
        reasons.append(f"acks slower than the target of {drill.target_s:g} s: {who}")
    counted = failed_sum(row["failed_requests"] for row in rows if row["failed_requests"] is not None)
    uncounted = [row["worker"] for row in rows if row["failed_requests"] is None]
    if counted and uncounted:
        reasons.append(f"at least {counted} request(s) failed during the drill "
                       f"(unknown for {len(uncounted)} worker(s): {', '.join(uncounted)})")
    elif counted:
        reasons.append(f"{counted} request(s) failed during the drill")
    return reasons


def console_stopped_words(drill: Drill, rows: list[dict], unheard: list[dict], stopped_s: float) -> str:
    """The summary's words for a drill the console stopped during (SIGTERM, Ctrl-C, a
    rolling update): uvicorn answers the drill's request while it stops, but hears no
    worker, so those not seen to follow by then are named as unheard, not as failing."""
    seen = sum(row["confirmed_s"] is not None for row in rows)
    who = ", ".join(f"{row['worker']} (no ack)" if row["ack_s"] is None else f"{row['worker']} (acked at {row['ack_s']:.2f} s, no report since)"
                    for row in unheard)
    return (f"{CONSOLE_STOPPED} (it stopped taking the workers' reports and acks {stopped_s:.1f} s after the click), so it could "
            f"not be measured: {seen} of {len(rows)} workers were seen serving generation {drill.to_generation} before that; "
            f"not yet seen: {who}")


def _note_uncounted_requests(drill: Drill) -> None:
    """A worker that followed but whose reports carry no failure counter (before or after
    the rollback) leaves the drill's failed requests unknown: said in the summary, where a
    passed drill otherwise read "0 failed requests". Workers that never confirmed are
    named already, with why, and so are these when requests were counted as failed ("at
    least N", ``failure_reasons``)."""
    uncounted = [row["worker"] for row in drill.workers if row["failed_requests"] is None and row["confirmed_s"] is not None]
    if uncounted and not any(row["failed_requests"] for row in drill.workers):
        _add_reason(drill, f"failed requests not counted for {len(uncounted)} worker(s), whose reports carry no failure counter: "
                           f"{', '.join(uncounted)}")


def _model_digest(report: dict | None, model: str) -> str | None:
    models = report.get("models") if report else None
    return models.get(model) if isinstance(models, dict) else None


def _note_other_models(drill: Drill) -> None:
    """A worker that followed the rollback while another model fails there: the drill
    passes, for its model served as issued, and the summary says what else failed."""
    followed = [row for row in drill.workers if row.get("note")]
    if followed:
        by_note: dict[str, list[str]] = {}
        for row in followed:  # each reason once: 20 workers repeated one sha256 error 20 times
            by_note.setdefault(row["note"], []).append(row["worker"])
        who = "; ".join(f"{', '.join(workers)} ({note})" for note, workers in by_note.items())
        _add_reason(drill, f"{len(followed)} worker(s) serve the rollback of {drill.model.name}, proved by its digest, "
                           f"but not the whole state: {who}")


def _note_silent_workers(drill: Drill) -> None:
    """A worker that was silent as the drill began and followed it all the same: said in
    the summary, where a frozen worker's drill read "passed, 0 failed requests" although
    its clients' requests waited for it (a failure counter counts answers, not waits).
    One that never confirmed has its silence in its row's reason already."""
    followed = [row for row in drill.workers if row["silent_before_s"] is not None and row["confirmed_s"] is not None]
    if followed:
        who = ", ".join(f"{row['worker']} (silent {row['silent_before_s']:.1f} s, confirmed at {row['confirmed_s']:.1f} s)" for row in followed)
        _add_reason(drill, f"{len(followed)} worker(s) silent as the drill began followed it, but requests sent to them meanwhile "
                           f"waited and are not among the failed: {who}")


def _note_console_stall(drill: Drill) -> None:
    """The console's own wait, overrun: its process or database paused (SIGSTOP for 15 s
    in a fault run), the rollback reached no worker meanwhile, and the summary blamed every
    worker ("no ack before the timeout") with nothing to say where the time went."""
    late_s = _since(drill, timezone.now()) - settings.DRILL_ACK_TIMEOUT_S
    if late_s > CONSOLE_STALL_SLACK_S:
        _add_reason(drill, f"the console itself stalled: its wait for the workers ended {late_s:.1f} s past the "
                           f"{settings.DRILL_ACK_TIMEOUT_S:g} s it allows (its process or its database paused), so a worker "
                           "named above may have received the rollback late or not at all")


def _record_end(drill: Drill) -> None:
    if not drill.to_digest:  # the database went before the digest was read
        drill.to_digest = issued_digest(drill.to_generation) or ""
    _finish(drill, drill.status, error=drill.error)


def _finish(drill: Drill, status: str, *, error: str = "") -> None:
    """Record the drill's end, unless the sweep finished it first: a process stalled past
    the bound (SIGSTOP for 70 s in a fault run) wrote its end over the sweep's, and its
    summary then called the sweep's roll forward "another change of the model"."""
    with transaction.atomic():
        recorded = Drill.objects.select_for_update(of=("self",)).filter(pk=drill.pk).values_list("status", flat=True).first()
        if recorded not in (None, DrillStatus.RUNNING):
            logger.warning("drill #%s: finished by the console's sweep while its own request stalled; the sweep's record stands", drill.pk)
            drill.refresh_from_db()
            return
        drill.status, drill.error, drill.finished_at = status, error, timezone.now()
        drill.save()
        events.drill_finished(drill)


def _roll_forward(drill: Drill, model: RegisteredModel, actor, workers: list[Worker]) -> None:
    """Restore ``from_generation`` over the drill's rollback, record it, wait for its acks.
    ``through_outage`` may run this again after the restore committed (the outage came
    while recording it, or during its COMMIT): the drill's own roll forward is then found
    and recorded, never taken for someone else's change."""
    try:
        release = stale_drills.own_roll_forward(drill, actor)
        if release is None:
            # Only over the drill's own rollback: a change an operator made meanwhile stands.
            release = releases.restore(model, drill.from_generation, actor, stale_drills.forward_reason(drill), expected_generation=drill.to_generation,
                                       checked=False)  # puts back what served before the drill
    except releases.GenerationConflict as conflict:
        changed_at = conflict.current.generation if conflict.current else "?"
        _record_reason(drill, f"not rolled forward: {model.name} changed during the drill (generation {changed_at}), and that change stands",
                       settled=True)
        return
    except releases.ReleaseError as error:
        _record_reason(drill, f"roll forward failed: {error.message}", settled=True)
        return
    drill.forward_generation, drill.forward_pending = release.generation, False
    drill.save(update_fields=["forward_generation", "forward_pending"])
    worker_ids = {worker.worker_id for worker in workers}
    # "Rolled forward" says a release was made; whether the workers that followed the
    # rollback took it too is said here (those that did not are named already). Only
    # theirs are waited for: a worker killed during the drill held its answer 10 s more.
    followed = [row["worker"] for row in drill.workers if (row.get("ok") or row.get("note")) and row.get("worker") in worker_ids]
    gone = _stopped_reporting(drill, followed)  # killed after its ack: no ack will come
    waited = [worker_id for worker_id in followed if worker_id not in gone]
    try:
        # A worker killed after it confirmed the rollback is not waited for past the moment it is gone.
        acks = wait_for_acks(waited, RollbackWindow(release), time.monotonic() + settings.DRILL_ACK_TIMEOUT_S,
                             gone=lambda waiting: _stopped_reporting(drill, waiting)) if waited else {}
    except Exception:
        logger.exception("drill #%s: waiting for the roll forward's acks failed", drill.pk)
        acks = {}
    unconfirmed = [worker_id for worker_id in followed if not (worker_id in acks and applied(acks[worker_id], drill.model.name))]
    # One that died while waited for is named so at the end, as the measure's rows do.
    died = _stopped_reporting(drill, [worker_id for worker_id in unconfirmed if worker_id not in gone and worker_id not in acks])
    # Nothing said, alive, and the console stopping: unheard, not "did not follow".
    unheard = [worker_id for worker_id in unconfirmed if worker_id not in acks and worker_id not in gone and worker_id not in died]
    stopped_s = _console_stopped_s(drill)
    if stopped_s is not None and unheard:
        _note_unheard_roll_forward(drill, release, followed, unheard, stopped_s)
        unconfirmed = [worker_id for worker_id in unconfirmed if worker_id not in unheard]
    if unconfirmed:
        # Each with why: "did not ack it" was said of workers that acked it failing.
        forward_s = _since(drill, release.created_at)
        who = ", ".join(f"{worker_id} ({_forward_words(acks.get(worker_id), worker_id in gone, died.get(worker_id), forward_s)})"
                        for worker_id in unconfirmed)
        drill.forward_unconfirmed = unconfirmed
        drill.save(update_fields=["forward_unconfirmed"])
        _record_reason(drill, f"rolled forward to generation {release.generation}, but {len(unconfirmed)} of {len(followed)} workers "
                              f"did not follow it within {settings.DRILL_ACK_TIMEOUT_S:g} s: {who}")


def _note_unheard_roll_forward(drill: Drill, release: Release, followed: list[str], unheard: list[str], stopped_s: float) -> None:
    """The workers whose ack of the roll forward the console could not hear, because it
    began to stop (``registry.process_stop``), said in the summary and not counted among
    those that did not follow it (``forward_unconfirmed``: the badge read "roll forward
    not followed by 2" of two workers that applied it within 0.05 s)."""
    _record_reason(drill, f"rolled forward to generation {release.generation}, but {CONSOLE_STOPPED} (it stopped taking the workers' "
                          f"acks {stopped_s:.1f} s after the click), so whether {len(unheard)} of {len(followed)} workers followed it "
                          f"was not watched: {', '.join(unheard)}")


# A worker's last report comes up to one report interval (1 s by default) before it dies.
REPORT_SLACK_S = 1.0


def _forward_words(ack: WorkerAck | None, gone: bool, died_s: float | None = None, forward_s: float = 0.0) -> str:
    """``died_s``: seconds from the click to the last report of a worker that stopped
    reporting while the roll forward waited; one that stopped before it was made (killed
    after it confirmed the rollback) was said to have died during it."""
    if ack is not None:
        return failed_to_apply(ack.error)
    if gone:
        return "it had stopped reporting: not waited for"
    if died_s is None:
        return "no ack"
    if died_s < forward_s - REPORT_SLACK_S:
        return f"its reports stopped {died_s:.1f} s after the click, before the roll forward: no longer waited for"
    return "it stopped reporting during the roll forward: no longer waited for"


def _note_paused_rollout(drill: Drill, rollout: Rollout) -> None:
    """The drill's rollback is a manual traffic change, which pauses a running rollout; the
    roll forward restores the split but not the rollout, which an audit found left paused
    (its canary at 20 % with no window judged) with nothing in the drill to say so."""
    rollout.refresh_from_db()
    if rollout.status == RolloutStatus.PAUSED:
        _record_reason(drill, f"rollout #{rollout.pk} was paused by the drill's rollback and stays paused until it is resumed")


def _add_reason(drill: Drill, words: str) -> None:
    """One more sentence in the drill's summary (``error``), after those it has."""
    drill.error = "; ".join(filter(None, [drill.error, words]))


def _record_reason(drill: Drill, words: str, *, settled: bool = False) -> None:
    """``_add_reason``, for a drill already recorded as finished: saved at once; with
    ``settled``, the words rule out its roll forward (``forward_pending`` cleared with them)."""
    before = (drill.error, drill.forward_pending)
    _add_reason(drill, words)
    drill.forward_pending = drill.forward_pending and not settled
    try:
        drill.save(update_fields=["error", "forward_pending"])
    except BaseException:
        drill.error, drill.forward_pending = before  # not recorded: a step ``through_outage`` tries again must not say it twice
        raise


def _since(drill: Drill, moment) -> float:
    return (moment - drill.started_at).total_seconds()
