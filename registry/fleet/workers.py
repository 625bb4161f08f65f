"""The console's view of the serving fleet: registrations, reports, acks, convergence.

Every worker holds the same token, so what a worker says is checked against what the
console knows: an ack must come from a worker that has reported, under the key that
claimed its id (worker_keys.py), and name a generation and digest this console issued. Acks and reports are parsed through ``serving.contract``
and refused whole when they speak another contract version. A refused ack or report is
stored nowhere.
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from registry.fleet import report_rate, worker_keys
from registry.fleet.issued_mark import highest_issued
from registry.fleet.state import issued_digest, issued_state, serving_counter, warm_versions
from registry.models import Release, ServingGeneration, Worker, WorkerAck, new_epoch
from serving.contract import WORKER_STATES, Ack, ContractError, WorkerReport, check_version, models_not_applied
from serving.state_signing import model_digests

logger = logging.getLogger(__name__)

SHOWN_ID_CHARS = 40
# How long a gone worker stays listed (faded) on the Workers page, named in each model's
# health and in a drill's "not measured" note: one window, so each one named can be found.
GONE_LISTED_FOR = timedelta(hours=1)
SHOWN_ERROR_CHARS = 300


class Refused(Exception):
    """A worker's ack or report the console cannot accept; the message says why (answered with 400)."""


class AckRefused(Refused):
    """An ack that breaks the contract, or names a worker or a state this console does not know."""


class ReportRefused(Refused):
    """A report that breaks the contract."""


def check_contract(message: object) -> None:
    """Refused (naming both versions) when ``message`` is an object of another contract
    version than this console's; asked before any other field is read, since a message
    of another version may have any shape."""
    if isinstance(message, dict):
        try:
            check_version(message)
        except ContractError as error:
            raise Refused(str(error)) from None


# has_key first: a report without a state (an older worker) is a live one, not NULL.
SAID_STOPPED = Q(last_report__has_key="state") & Q(last_report__state="stopped")


# A worker silent for less than this (past WORKER_GONE_AFTER_S, without saying it stopped)
# may still serve: a frozen process (SIGSTOP, a long GC or swap pause) or a host cut off
# from the console and Redis but not from its clients still holds its port. Drills wait
# for such workers, and a release is not "converged" while one has not proved it serves
# it: a partitioned worker answered 1,464 requests with the rolled-away version over 18 s
# while the release read "converged" from the two workers the console could hear. A fixed
# minute rather than a multiple of a setting: it covers the worker Deployment's liveness
# probe (deploy/k8s/base/worker.yaml: 3 failures 10 s apart, about 33 s to a restart);
# a worker silent longer is taken for dead, since every restart reports under a new id.
RECENTLY_SILENT_S = 60.0


def live_workers():
    """Workers that reported within WORKER_GONE_AFTER_S and did not say they stopped."""
    cutoff = timezone.now() - timedelta(seconds=settings.WORKER_GONE_AFTER_S)
    return Worker.objects.filter(last_seen_at__gte=cutoff).exclude(SAID_STOPPED)


def live_workers_brief() -> list[Worker]:
    """The live workers with what a load check reads (not their last reports, which may
    be megabytes each)."""
    return list(live_workers().only("worker_id", "ok", "error", "loaded", "last_seen_at"))


# A load error quoting the console's 503 ends with what to do ("restore its bytes there …,
# or route m away from v3"): cut at SHOWN_ERROR_CHARS, promote refusals lost it mid-sentence.
LOAD_ERROR_CHARS = 2 * SHOWN_ERROR_CHARS


def load_failure(model_name: str, version: int, workers: list[Worker] | None = None) -> str | None:
    """Why no live worker serves ``model_name`` v``version``, when none has it loaded and
    some say they failed to load it (a worker's load error names "<model> v<version>:");
    None while any serves it, or none has said it failed (they may still be loading it).
    ``workers``: the live workers, when the caller asks of several versions at once."""
    workers = live_workers_brief() if workers is None else workers
    if not workers or any(_has_loaded(worker, model_name, version) for worker in workers):
        return None
    # Where a load error begins: not inside another model's name ("ab v2:" is not "b v2:").
    named = re.compile(r"(?<![\w.-])" + re.escape(f"{model_name} v{version}:"))
    # Read only for an error cut short, which only it can settle: not on every check.
    routed = any(not worker.ok and worker.error.endswith("…") for worker in workers) and _routed_now(model_name, version)
    failed = [(worker, words) for worker in workers if not worker.ok and (words := _failure_words(worker.error, named, model_name, routed))]
    if not failed:
        return None
    return f"no worker serves v{version}: {len(failed)} of {len(workers)} live worker{'s' * (len(workers) != 1)} {failed[0][1]}"


def _routed_now(model_name: str, version: int) -> bool:
    """Whether the model's release in force routes ``version`` (weighted, warm or shadow)."""
    release = Release.objects.filter(model__name=model_name).order_by("-generation").only("routes").first()
    return release is not None and any(route.get("version") == version for route in release.routes)


def _failure_words(error: str, named: re.Pattern, model_name: str, routed: bool) -> str | None:
    """How ``error`` says the model failed on a worker: its load error, or, where the error
    was cut before it (MAX_ACK_ERROR_CHARS: five models' broken canaries), its name among
    those the state applied without, if the version is one the state in force routes (a
    version no state routed did not fail: another of the model's did). None when it does
    not say so."""
    if match := named.search(error):
        return f"failed to load it ({error[match.start():][:LOAD_ERROR_CHARS]})"
    if routed and error.endswith("…") and model_name in (models_not_applied(error) or ()):
        return f"failed to apply {model_name} (its error, cut to {len(error) - 1} characters, names it as failing but not why)"
    return None


def _has_loaded(worker: Worker, model_name: str, version: int) -> bool:
    return any(entry.get("model") == model_name and entry.get("version") == version and entry.get("ready", True)
               for entry in worker.loaded if isinstance(entry, dict))


CONVERGENCE_STATES = ("converged", "behind", "failing", "gone", "stopped")


def convergence_state(worker: Worker, generation: int, digests: IssuedDigests, now) -> str:
    """converged (proved by digest to serve the content issued as ``generation`` or later:
    the number a worker reports proves nothing alone) / behind (anything else it serves) /
    failing (its last apply failed: it may serve the current generation but for one model)
    / gone (silent for WORKER_GONE_AFTER_S; forgotten after WORKER_FORGET_AFTER_S) /
    stopped (its last report said it exited cleanly). The Workers page and /metrics both
    say it so."""
    phase = lifecycle(worker, now)
    if phase in ("gone", "stopped"):
        return phase
    if not worker.ok:
        return "failing"
    return "converged" if worker_status(worker, generation, digests, now)["converged"] else "behind"


def gone_workers():
    """Workers silent past WORKER_GONE_AFTER_S that never said they stopped (a crash, a
    frozen process, a lost host), until retention forgets them."""
    cutoff = timezone.now() - timedelta(seconds=settings.WORKER_GONE_AFTER_S)
    return Worker.objects.filter(last_seen_at__lt=cutoff).exclude(SAID_STOPPED)


def lifecycle(worker: Worker, now=None) -> str:
    """serving or draining (as its last report says), stopped (its last report said so:
    it answered everything it accepted and exited), or gone (silent for
    WORKER_GONE_AFTER_S without a word)."""
    report = worker.last_report if isinstance(worker.last_report, dict) else {}
    said = report.get("state", "serving")
    if said == "stopped":
        return "stopped"
    if worker.last_seen_at < (now or timezone.now()) - timedelta(seconds=settings.WORKER_GONE_AFTER_S):
        return "gone"
    return said if said in WORKER_STATES else "serving"


def record_report(message: dict, key: str | None = None) -> Worker:
    """Store a worker's latest report as parsed (``last_report``: only the fields the
    contract knows, each checked); the identity comes with every report. ReportRefused
    when it does not follow the contract; KeyRefused when another worker's ``key`` holds
    its id (worker_keys.py); report_rate.TooSoon when its id reports faster than it may."""
    try:
        report = WorkerReport.parse(message)
    except ContractError as error:
        raise ReportRefused(str(error)) from None
    counter = serving_counter()  # read once: the served generation and the epoch check both need it
    worker_id, fields = report.worker.id, reported_fields(report, counter[1])
    with transaction.atomic():
        worker = locked_worker(worker_id, fields, key)
        worker_keys.check(worker, worker_id, key)
        fields.update(worker_keys.claimed(worker, key))
        # Read under the lock: a report that waited for it, stamped before, set the time
        # back and let the next one earn the same seconds twice (24 a second passed a limit of 10).
        now = timezone.now()
        fields.update(last_seen_at=now, report_allowance=allowance_after_report(worker, now), report_allowance_at=now)
        for name, value in fields.items():
            setattr(worker, name, value)
        worker.save(update_fields=list(fields))
    renew_epoch_past(report, counter)
    return worker


def renew_epoch_past(report: WorkerReport, counter: tuple[int, str]) -> bool:
    """A new epoch when ``report`` serves a generation of this epoch the counter has not
    reached: the database went back (restored from a backup), and the generations above
    its counter were issued before, with other content, under this epoch. Every state
    signed then stayed a valid push: replayed on Redis, one rolled a worker back to the
    pre-restore routes, was acked and persisted, and made the worker drop the console's
    next real push as older. Under a new epoch those states are of another epoch, which a
    worker adopts only after asking the console; the new state is published at once.
    ``counter``: (generation, epoch) as read for this report. True when the epoch was renewed."""
    generation, epoch = counter
    _note_seen(epoch, generation)
    if not report.epoch or report.epoch != epoch or (report.generation or 0) <= generation:
        return False
    if _never_issued_past(epoch, generation):
        # No state of this epoch was issued past the counter, so this report is not a
        # restore's. A worker-token holder reading each new epoch and reporting past it
        # renewed it again and again, refusing real acks (and again after every traffic
        # change, or at every report with two console processes taken in turn). Decided
        # before the lock, which every traffic change waits on.
        return False
    with transaction.atomic():
        counter = ServingGeneration.objects.lock()
        if counter.epoch != report.epoch or report.generation <= counter.generation:
            return False  # renewed meanwhile, or the counter caught up
        counter.epoch = new_epoch()
        counter.epoch_renewed_at = counter.generation
        counter.save(update_fields=["epoch", "epoch_renewed_at"])
        transaction.on_commit(_publish)
    logger.warning("worker %r serves generation %s of epoch %s, past this database's counter (%s): the database went back "
                   "(restored?); a new epoch %s makes the states signed before it unusable as pushes",
                   report.worker.id[:SHOWN_ID_CHARS], report.generation, epoch, generation, counter.epoch)
    return True


def _never_issued_past(epoch: str, generation: int) -> bool:
    """No state of ``epoch`` above ``generation`` was ever issued, as far as can be known:
    by any console process (fleet.issued_mark, in Redis, which a restore of the database
    and a restart leave), or, when Redis cannot say, by this process, for an epoch a
    renewal minted at ``generation`` (the counter's row says so). Otherwise a report past
    the counter is a restore's: a restore missed is worse than a renewal too many."""
    issued = highest_issued(epoch)
    if issued is not None:
        return issued <= generation
    renewed_at = ServingGeneration.objects.filter(pk=1, epoch=epoch).values_list("epoch_renewed_at", flat=True).first()
    return renewed_at == generation and _SEEN.get(epoch, 0) <= generation


# Epoch -> the highest counter this process has read under it: a renewal's epoch is renewed
# again only once its counter went back from what was seen (a restore again). A few only:
# an epoch changes at a restore or a renewal.
_SEEN: dict[str, int] = {}
SEEN_EPOCHS = 8


def _note_seen(epoch: str, generation: int) -> None:
    if epoch not in _SEEN and len(_SEEN) >= SEEN_EPOCHS:
        _SEEN.pop(next(iter(_SEEN)))
    _SEEN[epoch] = max(_SEEN.get(epoch, generation), generation)


def _publish() -> None:
    from registry.fleet.publish import publish_desired_state  # needs the channel layer, which parsing reports does not

    publish_desired_state()


def allowance_after_report(worker: Worker, now) -> float:
    """What ``worker``'s id has saved up after this report; TooSoon when it has none. The
    bucket keeps its own time: ``last_seen_at`` moves with acks too."""
    bucket = report_rate.Bucket(settings.WORKER_REPORTS_PER_S, settings.WORKER_REPORT_BURST)
    if worker.report_allowance is None or worker.report_allowance_at is None:  # a new id: a full bucket
        return bucket.burst - 1.0
    return bucket.spend(worker.report_allowance, worker.report_allowance_at, now)


def reported_fields(report: WorkerReport, epoch: str) -> dict:
    """What an accepted report sets on its worker's row."""
    identity = report.worker
    return {
        "host": identity.host,
        "pid": identity.pid,
        "url": identity.url,
        "device": identity.device,
        "generation": served_generation(report, epoch),
        # A worker that said it stopped serves nothing: its last report still lists what
        # it held while it drained, which the Workers page showed as loaded for good.
        "loaded": [] if report.state == "stopped" else [entry.to_dict() for entry in report.loaded],
        "last_report": report.to_dict(),
        "last_seen_at": timezone.now(),
    }


CLAIM_ATTEMPTS = 3


def locked_worker(worker_id: str, fields: dict, key: str | None) -> Worker:
    """The row of ``worker_id``, locked until the transaction ends; a new id's row is
    inserted first, claimed by ``key``. Locking alone is not enough for a new id: two
    first reports found no row to lock, both passed the key check, and the second's
    write replaced the first's claim, so the last key held the id and both were accepted."""
    locked = Worker.objects.select_for_update().filter(worker_id=worker_id)
    for _ in range(CLAIM_ATTEMPTS):
        # Looked for first: a known worker (nearly every report) costs no insert, and
        # PostgreSQL draws an id from the sequence even for an insert that does nothing.
        worker = locked.first()
        if worker is not None:
            return worker
        # ON CONFLICT DO NOTHING: a racing first insert of the same id makes this one wait
        # for it to commit and then insert nothing, so exactly one key's claim is stored and
        # the lock below finds that row (its key checked by the caller).
        claim = Worker(worker_id=worker_id, **fields, **worker_keys.claimed(None, key))
        Worker.objects.bulk_create([claim], ignore_conflicts=True)
        worker = locked.first()
        if worker is not None:
            return worker
        # The racing insert's row was forgotten (forget_worker) before the lock: again.
    raise RuntimeError(f"worker {worker_id[:SHOWN_ID_CHARS]!r}: its row vanished {CLAIM_ATTEMPTS} times while being claimed")


def served_generation(report: WorkerReport, epoch: str) -> int:
    """The generation a report says is served, counted only in this console's ``epoch``: a
    worker still on another database's states serves none of ours."""
    if report.epoch and report.epoch != epoch:
        return 0
    return report.generation or 0


def check_ack(ack: Ack, key: str | None = None) -> None:
    worker = Worker.objects.filter(worker_id=ack.worker).first()
    if worker is None:
        raise AckRefused(f"worker {ack.worker[:SHOWN_ID_CHARS]!r} has not reported: a worker reports before it acks")
    worker_keys.check(worker, ack.worker, key)
    epoch = serving_counter()[1]
    if ack.epoch and ack.epoch != epoch:
        raise AckRefused(f"epoch {ack.epoch[:SHOWN_ID_CHARS]!r} is not this console's ({epoch}): the ack is of another database's state")
    issued = issued_digest(ack.generation)
    if issued is None:
        raise AckRefused(f"generation {ack.generation} was never issued by this console")
    if ack.digest != issued:
        raise AckRefused(f"digest {ack.digest[:12]}… is not the state this console issued as generation {ack.generation}")


def record_ack(message: dict, key: str | None = None) -> WorkerAck:
    """Idempotent: a repeated ack for the same generation keeps the first, except that an
    ok ack replaces a failed one (the worker's retry applied the state, and a drill
    waiting for it must see so). AckRefused when the ack does not follow the contract or
    match a reported worker and an issued state; KeyRefused when the worker's id is held
    by another ``key``."""
    try:
        ack = Ack.parse(message)
    except ContractError as error:
        raise AckRefused(str(error)) from None
    check_ack(ack, key)
    error = ack.error or ""
    try:
        with transaction.atomic():
            stored = WorkerAck.objects.create(worker_id=ack.worker, generation=ack.generation, ok=ack.ok, error=error, load_ms=ack.load_ms)
    except IntegrityError:
        if ack.ok:
            WorkerAck.objects.filter(worker_id=ack.worker, generation=ack.generation, ok=False).update(
                ok=True, error="", load_ms=ack.load_ms, received_at=timezone.now())
        stored = WorkerAck.objects.get(worker_id=ack.worker, generation=ack.generation)
    changes = {"ok": ack.ok, "error": error, "last_seen_at": timezone.now()}
    if ack.ok:
        changes["generation"] = ack.generation
    Worker.objects.filter(worker_id=ack.worker).update(**changes)
    return stored


class FleetView:
    """What judging several releases reads once: the live and the recently silent workers,
    and the issued digests. The Models list judges every model's release: built per model,
    a silent worker's proof (a state recomputed, two queries a model) cost each row all the
    models again (3,881 queries for 30 models)."""

    def __init__(self) -> None:
        self.now = timezone.now()
        self.live = list(live_workers())
        self.silent = list(recently_silent_workers(self.now))
        self.digests = IssuedDigests()


def convergence(release: Release | None, fleet: FleetView | None = None) -> dict:
    """Which live workers serve the content of ``release`` (or later), proved by digest (of
    the whole state, or of the release's model where another model fails on a worker),
    which recently silent workers have not proved it (``unconfirmed_silent``: each keeps
    the release from "converged"), and whether its rollback target is warm everywhere.
    ``fleet``: read once for several releases."""
    fleet = fleet or FleetView()
    generation = release.generation if release else 0
    rows = [_worker_convergence(worker, release, generation, fleet.digests) for worker in fleet.live]
    silent = _unconfirmed_silent(release, generation, fleet)
    return {
        "workers": rows,
        "unconfirmed_silent": silent,
        "live_converged": bool(rows) and all(row["converged"] for row in rows),
        "converged": bool(rows) and all(row["converged"] for row in rows) and not silent,
        # Converged for this model while another model fails there: said beside "converged".
        "failing_elsewhere": sum(row["converged"] and not row["ok"] for row in rows),
        "rollback_ready": bool(rows) and release is not None and release.rollback_target is not None and not release.is_archive and all(row["rollback_warm"] for row in rows),
    }


def recently_silent_workers(now=None):
    """Workers gone (silent past WORKER_GONE_AFTER_S, no word of stopping) for less than
    RECENTLY_SILENT_S: they may still serve."""
    now = now or timezone.now()
    gone_before = now - timedelta(seconds=settings.WORKER_GONE_AFTER_S)
    return Worker.objects.filter(last_seen_at__lt=gone_before, last_seen_at__gte=now - timedelta(seconds=RECENTLY_SILENT_S)).exclude(SAID_STOPPED)


def _unconfirmed_silent(release: Release | None, generation: int, fleet: FleetView) -> list[dict]:
    """The recently silent workers whose last proof is older than ``release``: what they
    serve now is unknown, and may be what it replaced."""
    if release is None:
        return []
    model_name, digests, now = release.model.name, fleet.digests, fleet.now
    rows = []
    for worker in fleet.silent:
        proven = proven_generation(worker, digests)
        if (proven is not None and proven >= generation) or serves_issued_model(worker.last_report, generation, model_name, digests):
            continue
        silent_s = (now - worker.last_seen_at).total_seconds()
        last = f"it last proved generation {proven}" if proven is not None else "it never proved a state"
        rows.append({"worker_id": worker.worker_id, "silent_s": round(silent_s, 1), "last_seen_at": worker.last_seen_at,
                     "state": (f"silent {silent_s:.0f} s, {last}: frozen, cut off or dead; if it serves, it may serve what generation "
                               f"{generation} replaced (taken for dead {RECENTLY_SILENT_S:g} s after its last report)")})
    return rows


def _worker_convergence(worker: Worker, release: Release | None, generation: int, digests: IssuedDigests) -> dict:
    warm_needed = set(warm_versions(release)) if release else set()
    model_name = release.model.name if release else None
    loaded_warm = {entry["version"] for entry in worker.loaded if entry.get("model") == model_name and entry.get("ready", True)}
    return {
        "worker_id": worker.worker_id,
        "generation": worker.generation,
        **worker_status(worker, generation, digests, model=model_name),
        "ok": worker.ok,
        "error": worker.error,
        "rollback_warm": warm_needed <= loaded_warm,
        "last_seen_at": worker.last_seen_at,
    }


class IssuedDigests(dict):
    """generation → the digest this console issued for it (None: not issued), each
    computed once: a state is recomputed from the releases, which costs queries. "Not
    issued" is not kept, since a poll may see that generation issued a moment later.
    ``epoch`` is this database's, read once too: a page or a scrape judges every worker
    with one of these, and a read per worker made it N+1 queries."""

    _epoch: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self._models: dict[int, dict[str, str]] = {}

    def model_digest(self, generation: int, model: str) -> str | None:
        """The digest of ``model``'s entry in the state issued as ``generation``; None when
        that state was never issued or left the model out."""
        return self._models.get(generation, {}).get(model) if self[generation] is not None else None

    @property
    def epoch(self) -> str:
        if self._epoch is None:
            self._epoch = serving_counter()[1]
        return self._epoch

    def __missing__(self, generation: int) -> str | None:
        state = issued_state(generation)
        if state is None:
            return None
        self[generation], self._models[generation] = state.digest, model_digests(state)
        return state.digest


def serves_issued_state(report: object, generation: int, digests: IssuedDigests) -> bool:
    """The report names a generation at or after ``generation`` with the digest this
    console issued for it: the number alone proves nothing about the content."""
    served = report.get("generation") if isinstance(report, dict) else None
    if type(served) is not int or served < generation:
        return False
    return digests[served] is not None and report.get("digest") == digests[served]


def serves_issued_model(report: object, generation: int, model: str, digests: IssuedDigests) -> bool:
    """The report names a generation at or after ``generation`` and serves ``model`` as this
    console issued it there: the whole state's digest proves it, or the model's own digest
    where the worker serves that state but for another model (its version fails there)."""
    if serves_issued_state(report, generation, digests):
        return True
    report = report if isinstance(report, dict) else {}
    served, models = report.get("generation"), report.get("models")
    if type(served) is not int or served < generation or not isinstance(models, dict) or report.get("epoch") not in (None, digests.epoch):
        return False  # another database's generation numbers name other states
    issued = digests.model_digest(served, model)
    return issued is not None and models.get(model) == issued


def proven_generation(worker: Worker, digests: IssuedDigests) -> int | None:
    """The generation whose issued content ``worker`` serves, proved by a digest; None
    when nothing it sent proves any."""
    report = worker.last_report if isinstance(worker.last_report, dict) else {}
    if report.get("epoch") and report["epoch"] != digests.epoch:
        return None  # another database's generation numbers name other states (served_generation counts it as 0 too)
    reported = report.get("generation")
    # Only an ok ack sets a generation above the report's, and an ack is stored only
    # when it names the digest issued for its generation: the ack is newer news than
    # the report, already checked.
    if worker.ok and worker.generation > (reported if type(reported) is int else 0):
        return worker.generation
    return reported if serves_issued_state(report, 0, digests) else None


def served_digest(worker: Worker, digests: IssuedDigests) -> str | None:
    """The digest of the content ``worker`` serves as ``worker.generation``, so the two
    are shown as a pair: an ok ack moves the generation past the last report's, and the
    ack's digest was the one issued for it (``check_ack``)."""
    report = worker.last_report if isinstance(worker.last_report, dict) else {}
    reported = report.get("generation")
    if type(reported) is int and worker.generation == reported:
        return report.get("digest")
    if worker.ok and worker.generation > (reported if type(reported) is int else 0):
        return digests[worker.generation]
    return None  # a report of another database's states: it serves none of this console's


def worker_status(worker: Worker, generation: int, digests: IssuedDigests, now=None, model: str | None = None) -> dict:
    """``converged`` (serving the issued content of ``generation`` or later; with ``model``,
    that model's part of it at least) and the worker's state in words. A stopped or gone
    worker serves nothing it can be counted for: it said "behind: serving generation 18"
    after it had exited."""
    proven = proven_generation(worker, digests)
    phase = lifecycle(worker, now)
    if phase in ("stopped", "gone"):
        served = f": it last served generation {proven}" if proven is not None else ""
        return {"converged": False, "state": f"{phase}{served}"}
    converged = worker.ok and proven is not None and proven >= generation
    if not converged and model is not None and serves_issued_model(worker.last_report, generation, model, digests):
        # Said with what else failed there: the worker is not converged for every model.
        words = f"serving {model[:SHOWN_ID_CHARS]} as issued for generation {worker.last_report['generation']}"
        return {"converged": True, "state": words if worker.ok else f"{words}; {failed_to_apply(worker.error)}"}
    return {"converged": converged, "state": _state_words(worker, proven, generation, converged)}


def failed_to_apply(error: str) -> str:
    """A worker's own reason for failing to apply a state, as the console shows it; a state
    it applied but for some models says so itself ("failed to apply: applied but for …"
    contradicted itself)."""
    if models_not_applied(error):
        return error[:SHOWN_ERROR_CHARS]
    return f"failed to apply: {error[:SHOWN_ERROR_CHARS] or 'no reason given'}"


def _state_words(worker: Worker, proven: int | None, generation: int, converged: bool) -> str:
    report = worker.last_report if isinstance(worker.last_report, dict) else {}
    reported, digest = report.get("generation"), report.get("digest")
    if not worker.ok:
        return failed_to_apply(worker.error)
    if converged:
        return f"serving generation {proven}"
    if proven is not None:
        return f"behind: serving generation {proven}, the console is at generation {generation}"
    if digest is None:
        return "no state applied yet" if not reported else f"serving generation {reported}, not yet confirmed by a digest"
    return f"serving content this console did not issue as generation {reported} (digest {str(digest)[:12]}…)"
