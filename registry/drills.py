"""Rollback drills: a timed rollback, measured from the operator's click to every live
worker acking and serving the restored routes, with the failed requests counted."""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from django.conf import settings
from django.utils import timezone

from registry import events, releases
from registry.choices import DrillStatus
from registry.fleet import live_workers
from registry.models import Drill, RegisteredModel, Release, Worker, WorkerAck

logger = logging.getLogger(__name__)
POLL_S = 0.02
PROBE_TIMEOUT_S = 2.0


def run_drill(model: RegisteredModel, actor, *, roll_forward: bool = False) -> Drill:
    workers = list(live_workers())
    current = model.current_release()
    drill = Drill.objects.create(
        model=model, actor=actor if actor.is_authenticated else None, started_at=timezone.now(), target_s=settings.DRILL_TARGET_S,
        roll_forward=roll_forward, from_generation=current.generation if current else None,
    )
    with ThreadPoolExecutor(max_workers=max(len(workers), 1)) as pool:
        failed_before = dict(zip([worker.worker_id for worker in workers], pool.map(failed_total, workers)))
    drill.started_at = timezone.now()  # the operator's click, after the probes above
    try:
        release = releases.rollback(model, actor, f"rollback drill #{drill.pk}")
    except releases.ReleaseError as error:
        _finish(drill, DrillStatus.ERROR, error=error.message)
        raise
    drill.to_generation = release.generation
    rows = _measure(drill, workers, release, failed_before)
    _judge(drill, rows)
    if roll_forward:
        _roll_forward(drill, model, actor, workers)
    return drill


def failed_total(worker: Worker) -> int | None:
    """Requests the worker answered with a server-side failure since it started."""
    body = _probe(worker, "/health")
    return None if body is None else body.get("requests_failed_total")


def _measure(drill: Drill, workers: list[Worker], release: Release, failed_before: dict) -> list[dict]:
    deadline = time.monotonic() + settings.DRILL_ACK_TIMEOUT_S
    acks = wait_for_acks([worker.worker_id for worker in workers], release.generation, deadline)
    # Probe every worker at once: a slow one must not delay the others' confirmation.
    with ThreadPoolExecutor(max_workers=max(len(workers), 1)) as pool:
        rows = list(pool.map(lambda worker: _worker_row(drill, worker, release, acks.get(worker.worker_id), failed_before, deadline), workers))
    return rows


def _worker_row(drill: Drill, worker: Worker, release: Release, ack: WorkerAck | None, failed_before: dict, deadline: float) -> dict:
    confirmed_s, seen = _confirm(drill, worker, release, deadline) if ack and ack.ok else (None, None)
    after = failed_total(worker)
    before = failed_before.get(worker.worker_id)
    return {
        "worker": worker.worker_id,
        "ack_s": _since(drill, ack.received_at) if ack else None,
        "ok": ack.ok if ack else None,
        "error": _row_error(ack, confirmed_s, seen),
        "confirmed_s": confirmed_s,
        "failed_requests": None if before is None or after is None else max(after - before, 0),
    }


def wait_for_acks(worker_ids: list[str], generation: int, deadline: float) -> dict[str, WorkerAck]:
    """The first ack of ``generation`` or later from each worker, until the deadline."""
    acks: dict[str, WorkerAck] = {}
    while True:
        for ack in WorkerAck.objects.filter(worker_id__in=worker_ids, generation__gte=generation).order_by("received_at"):
            acks.setdefault(ack.worker_id, ack)
        if len(acks) == len(worker_ids) or time.monotonic() >= deadline:
            return acks
        time.sleep(POLL_S)


def _confirm(drill: Drill, worker: Worker, release: Release, deadline: float) -> tuple[float | None, object]:
    """Seconds until the worker's own metadata reports the release's routes, and what
    the last probe saw (kept for the report when it never did)."""
    expected = sorted((route["version"], route["weight"]) for route in release.routes if route["weight"] > 0)
    seen: object = "no answer"
    while time.monotonic() < deadline:
        body = _probe(worker, f"/v2/models/{release.model.name}")
        seen = "no answer" if body is None else sorted(_routed(body))
        if seen == expected:
            return (timezone.now() - drill.started_at).total_seconds(), seen
        time.sleep(POLL_S)
    return None, seen


def _row_error(ack: WorkerAck | None, confirmed_s: float | None, seen: object) -> str:
    if ack is None:
        return "no ack before the timeout"
    if not ack.ok:
        return ack.error
    if confirmed_s is None:
        return f"acked, but its metadata never showed the new routes (last probe: {seen})"
    return ""


def _routed(metadata: dict) -> list[tuple[int, int]]:
    routes = (metadata.get("parameters") or {}).get("routes") or []
    return [(int(route["version"]), int(route["weight"])) for route in routes if route.get("weight", 0) > 0]


def _probe(worker: Worker, path: str) -> dict | None:
    if not worker.url:
        return None
    try:
        response = _probe_client().get(worker.url.rstrip("/") + path)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


@functools.cache
def _probe_client() -> httpx.Client:
    """One pooled client for every probe: building a client (its TLS context) per call
    costs tens of milliseconds, which would show up as drill time."""
    return httpx.Client(timeout=PROBE_TIMEOUT_S, limits=httpx.Limits(max_connections=64))


def _judge(drill: Drill, rows: list[dict]) -> None:
    drill.workers = rows
    ack_times = [row["ack_s"] for row in rows if row["ack_s"] is not None]
    confirmed = [row["confirmed_s"] for row in rows]
    failures = [row["failed_requests"] for row in rows if row["failed_requests"] is not None]
    drill.first_ack_s = min(ack_times) if ack_times else None
    drill.last_ack_s = max(ack_times) if len(ack_times) == len(rows) and rows else None
    drill.confirmed_s = max(confirmed) if rows and all(value is not None for value in confirmed) else None
    drill.failed_requests = sum(failures)
    passed = bool(rows) and drill.confirmed_s is not None and drill.last_ack_s <= drill.target_s and drill.failed_requests == 0
    _finish(drill, DrillStatus.PASSED if passed else DrillStatus.FAILED, error="" if rows else "no live workers to follow the rollback")


def _finish(drill: Drill, status: str, *, error: str = "") -> None:
    drill.status = status
    drill.error = error or _worker_errors(drill)
    drill.finished_at = timezone.now()
    drill.save()
    events.drill_finished(drill)


def _worker_errors(drill: Drill) -> str:
    return "; ".join(f"{row['worker']}: {row['error']}" for row in drill.workers if row.get("ok") is not True)


def _roll_forward(drill: Drill, model: RegisteredModel, actor, workers: list[Worker]) -> None:
    try:
        release = releases.restore(model, drill.from_generation, actor, f"roll forward after drill #{drill.pk}")
    except releases.ReleaseError as error:
        drill.error = f"roll forward failed: {error.message}"
        drill.save(update_fields=["error"])
        return
    wait_for_acks([worker.worker_id for worker in workers], release.generation, time.monotonic() + settings.DRILL_ACK_TIMEOUT_S)


def _since(drill: Drill, moment) -> float:
    return (moment - drill.started_at).total_seconds()
