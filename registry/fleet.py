"""The console's view of the serving fleet: registrations, reports, acks, convergence.

Every worker holds the same token, so what a worker says is checked against what the
console knows: an ack must come from a worker that has reported, and name a generation
and digest this console issued. A refused ack is stored nowhere.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from registry.models import Release, Worker, WorkerAck
from registry.state import issued_digest, serving_counter, warm_versions

SHOWN_ID_CHARS = 40


class AckRefused(Exception):
    """An ack the console cannot accept; the message says why (answered with 400)."""


def live_workers():
    """Workers that reported within WORKER_GONE_AFTER_S."""
    cutoff = timezone.now() - timedelta(seconds=settings.WORKER_GONE_AFTER_S)
    return Worker.objects.filter(last_seen_at__gte=cutoff)


def record_report(report: dict) -> Worker:
    """Store a worker's latest report; the identity fields come with every report."""
    identity = report["worker"]
    worker, _ = Worker.objects.update_or_create(
        worker_id=identity["id"],
        defaults={
            "host": identity.get("host", ""),
            "pid": identity.get("pid"),
            "url": identity.get("url", ""),
            "device": identity.get("device", ""),
            "generation": served_generation(report),
            "loaded": report.get("loaded", []),
            "last_report": report,
            "last_seen_at": timezone.now(),
        },
    )
    return worker


def served_generation(report: dict) -> int:
    """The generation a report says is served, counted only in this console's epoch: a
    worker still on another database's states serves none of ours."""
    epoch = report.get("epoch")
    if epoch and epoch != serving_counter()[1]:
        return 0
    return report.get("generation") or 0


def check_ack(ack: dict) -> None:
    worker_id = ack["worker"]
    if not Worker.objects.filter(worker_id=worker_id).exists():
        raise AckRefused(f"worker {worker_id[:SHOWN_ID_CHARS]!r} has not reported: a worker reports before it acks")
    issued = issued_digest(ack["generation"])
    if issued is None:
        raise AckRefused(f"generation {ack['generation']} was never issued by this console")
    if ack["digest"] != issued:
        raise AckRefused(f"digest {ack['digest'][:12]}… is not the state this console issued as generation {ack['generation']}")


def record_ack(ack: dict) -> WorkerAck:
    """Idempotent: a repeated ack for the same generation keeps the first. AckRefused
    when the ack does not match a reported worker and an issued state."""
    check_ack(ack)
    try:
        with transaction.atomic():
            stored = WorkerAck.objects.create(
                worker_id=ack["worker"], generation=ack["generation"], ok=ack["ok"], error=ack.get("error") or "", load_ms=ack.get("load_ms") or 0.0
            )
    except IntegrityError:
        stored = WorkerAck.objects.get(worker_id=ack["worker"], generation=ack["generation"])
    changes = {"ok": ack["ok"], "error": ack.get("error") or "", "last_seen_at": timezone.now()}
    if ack["ok"]:
        changes["generation"] = ack["generation"]
    Worker.objects.filter(worker_id=ack["worker"]).update(**changes)
    return stored


def convergence(release: Release | None) -> dict:
    """Which live workers serve ``release`` (or later), and whether rollback is warm."""
    workers = list(live_workers())
    generation = release.generation if release else 0
    rows = [_worker_convergence(worker, release, generation) for worker in workers]
    return {
        "workers": rows,
        "converged": bool(rows) and all(row["converged"] for row in rows),
        "rollback_ready": bool(rows) and release is not None and release.rollback_target is not None and all(row["rollback_warm"] for row in rows),
    }


def _worker_convergence(worker: Worker, release: Release | None, generation: int) -> dict:
    warm_needed = set(warm_versions(release)) if release else set()
    model_name = release.model.name if release else None
    loaded_warm = {entry["version"] for entry in worker.loaded if entry.get("model") == model_name and entry.get("ready", True)}
    return {
        "worker_id": worker.worker_id,
        "generation": worker.generation,
        "converged": worker.generation >= generation and worker.ok,
        "ok": worker.ok,
        "error": worker.error,
        "rollback_warm": warm_needed <= loaded_warm,
        "last_seen_at": worker.last_seen_at,
    }
