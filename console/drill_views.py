"""One drill's page: what the drill recorded, down to each worker (its ack and confirmation
times, the digest it confirmed, its failed requests and the drill's words on it). The
Drills page and the model page give a drill's figures for the slowest worker; the ops team
asked how long *every* worker took to follow. Read-only, for every signed-in role.

The rows are ``Drill.workers`` as ``registry.actions.drills`` (``_worker_row``) and
``registry.actions.stale_drills`` (``_acks_received``) write them. They are stored JSON,
kept across code versions: a row is read key by key, a value of the wrong type is shown
as written rather than formatted, and a key this page does not know is shown as such,
never dropped and never an error.
"""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404

from console.views import _page
from registry.domain.choices import DrillStatus
from registry.models import Drill, Worker

DRILL_FRAGMENTS = {"drill": "console/fragments/drill_detail.html"}
DIGEST_SHOWN_CHARS = 12
# Keys whose value this page renders in its own column or in words; any other is listed as written.
KNOWN_KEYS = frozenset({"worker", "ack_s", "ok", "error", "note", "confirmed_s", "silent_before_s", "generation", "digest", "model_digest",
                        "failed_requests", "restarted", "quiet_after_confirming"})
UNKNOWN_VALUE_CHARS = 200


@login_required
def drill_page(request, pk: int):
    drill = get_object_or_404(Drill.objects.select_related("model", "actor"), pk=pk)
    return _page(request, "console/drill.html", {"nav": "drills", **drill_context(drill)}, DRILL_FRAGMENTS)


def drill_context(drill: Drill) -> dict:
    entries = drill.workers if isinstance(drill.workers, list) else []
    ids = [entry.get("worker") for entry in entries if isinstance(entry, dict) and isinstance(entry.get("worker"), str)]
    hosts = dict(Worker.objects.filter(worker_id__in=ids).values_list("worker_id", "host"))
    return {
        "drill": drill,
        "running": drill.status == DrillStatus.RUNNING,
        # Finished, and its roll forward neither made nor ruled out yet: the page keeps looking.
        "forward_owed": drill.status != DrillStatus.RUNNING and drill.forward_pending,
        "to_digest_short": drill.to_digest[:DIGEST_SHOWN_CHARS],
        "rows": [worker_row(entry, drill, hosts) for entry in entries],
    }


def worker_row(entry: object, drill: Drill, hosts: dict[str, str]) -> dict:
    """One entry of ``drill.workers`` as the table shows it; ``notes`` are (kind, words)."""
    if not isinstance(entry, dict):
        return {**_empty_row(), "notes": [("unexpected", f"an entry this page cannot read: {_as_written(entry)}")]}
    unexpected = {key: value for key, value in entry.items() if key not in KNOWN_KEYS}
    ack_s, confirmed_s = _seconds(entry, "ack_s", unexpected), _seconds(entry, "confirmed_s", unexpected)
    worker_id = entry.get("worker")
    worker_id = worker_id if isinstance(worker_id, str) and worker_id else "?"
    digest, generation = _typed(entry, "digest", str, unexpected), _typed(entry, "generation", int, unexpected)
    failed_requests = _typed(entry, "failed_requests", int, unexpected)
    return {
        "worker": worker_id,
        "host": hosts.get(worker_id, ""),
        "ack_s": ack_s,
        "ack_failed": entry.get("ok") is False,
        "ack_slow": ack_s is not None and ack_s > drill.target_s,
        "confirmed_s": confirmed_s,
        "generation": generation,
        "digest": digest or "",
        "digest_short": (digest or "")[:DIGEST_SHOWN_CHARS],
        "match_explained": False,
        **digest_match(digest or "", generation, confirmed_s, _text(entry.get("model_digest")), drill),
        "failed_requests": failed_requests,
        "notes": _notes(entry, ack_s, confirmed_s) + [("unexpected", f"{key}: {_as_written(value)}") for key, value in unexpected.items()],
    }


def digest_match(digest: str, generation: int | None, confirmed_s: float | None, model_digest: str, drill: Drill) -> dict:
    """Whether the digest the worker confirmed is the rollback's (``to_digest``), and why a
    confirmed worker's may differ (``match_explained``): it served a later state that kept
    the rollback, or it was proved by the model's own digest while another model failed
    there (``registry.fleet.workers.serves_issued_model``)."""
    if not digest:
        return {"match": "none", "match_words": "no report confirmed it" if confirmed_s is None else "no digest recorded"}
    if not drill.to_digest:
        return {"match": "unknown", "match_words": "the rollback's digest was not recorded"}
    if digest == drill.to_digest:
        return {"match": "yes", "match_words": "matches the rollback's digest"}
    words = "differs from the rollback's digest"
    if confirmed_s is not None and generation is not None and generation != drill.to_generation:
        return {"match": "no", "match_explained": True, "match_words": f"{words}: it served generation {generation}, a later state that kept the rollback"}
    if confirmed_s is not None and model_digest:
        return {"match": "no", "match_explained": True, "match_words": (f"{words}: confirmed by the digest of {drill.model.name} alone "
                                                                        f"({model_digest[:DIGEST_SHOWN_CHARS]}…), another model failing there")}
    return {"match": "no", "match_words": words}


def _notes(entry: dict, ack_s: float | None, confirmed_s: float | None) -> list[tuple[str, str]]:
    """What the drill said of this worker, each in words (the row's ``error`` is the drill's
    own). A silence before the drill is said here of a worker that followed; the ``error``
    of one that did not says it already."""
    notes = []
    if ack_s is None and not _text(entry.get("error")):
        notes.append(("error", "never acked"))
    for kind, key, lead in (("error", "error", ""), ("note", "note", "followed, but not the whole state: "),
                            ("note", "restarted", "restarted during the drill: "), ("note", "quiet_after_confirming", "silent after confirming: ")):
        if words := _text(entry.get(key)):
            notes.append((kind, lead + words))
        elif entry.get(key) not in (None, ""):
            notes.append(("unexpected", f"{key}: {_as_written(entry[key])}"))
    silent_s = entry.get("silent_before_s")
    if _is_number(silent_s) and confirmed_s is not None:
        notes.append(("note", f"silent {silent_s:.1f} s before the drill began"))
    elif silent_s is not None and not _is_number(silent_s):
        notes.append(("unexpected", f"silent_before_s: {_as_written(silent_s)}"))
    return notes


def _empty_row() -> dict:
    return {"worker": "?", "host": "", "ack_s": None, "ack_failed": False, "ack_slow": False, "confirmed_s": None, "generation": None, "digest": "",
            "digest_short": "", "match": "none", "match_explained": False, "match_words": "", "failed_requests": None}


def _seconds(entry: dict, key: str, unexpected: dict) -> float | None:
    """A time in the row, or None; one of another type is shown as written among the notes."""
    value = entry.get(key)
    if _is_number(value):
        return float(value)
    if value is not None:
        unexpected[key] = value
    return None


def _typed(entry: dict, key: str, kind: type, unexpected: dict):
    """The row's ``key`` when it is a ``kind`` (never a bool), else None; one of another
    type is shown as written among the notes."""
    value = entry.get(key)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    unexpected[key] = value
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _as_written(value: object) -> str:
    words = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return words if len(words) <= UNKNOWN_VALUE_CHARS else words[:UNKNOWN_VALUE_CHARS - 1] + "…"
