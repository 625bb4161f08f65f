"""Pages are tested with Django's test client, signed in as each persona."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from registry.actions import releases, rollouts
from registry.domain.choices import VersionStatus
from registry.fleet import live, samples
from registry.fleet.state import issued_digest
from registry.models import ModelVersion, RegisteredModel, Rollout, Worker
from tests.fixtures.store import stand_in_file

SIGNATURE = {
    "inputs": [{"name": "input", "datatype": "FP32", "shape": ["batch", 4]}],
    "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": ["batch", 3]}],
    "opset": 17,
    "producer": "tests",
}


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator_page(operator) -> Client:
    return signed_in(operator)


@pytest.fixture
def viewer_page(viewer) -> Client:
    return signed_in(viewer)


@pytest.fixture
def admin_page(admin_user) -> Client:
    return signed_in(admin_user)


def add_version(model: RegisteredModel, number: int, **fields) -> ModelVersion:
    """A ready version row, with a stand-in stored file (pages only read rows; a split
    refuses a version whose stored file is missing)."""
    defaults = {
        "sha256": f"{number:064x}", "size_bytes": 1000 * number, "status": VersionStatus.READY, "signature": SIGNATURE,
        "opset": 17, "producer": "tests", "metrics": {"accuracy": 0.9 + number / 100},
        "validation_report": {"checks": [{"name": "parse", "ok": True, "message": "parsed", "elapsed_ms": 0.3}], "provider": "CPUExecutionProvider"},
    }
    version = ModelVersion.objects.create(model=model, number=number, **{**defaults, **fields})
    if version.status == VersionStatus.READY:
        stand_in_file(version.sha256, version.size_bytes)
    return version


def incompatible_v3(model: RegisteredModel) -> ModelVersion:
    """v3 takes 8 inputs where the stable v1 takes 4, as its validation report says."""
    signature = {**SIGNATURE, "inputs": [{"name": "input", "datatype": "FP32", "shape": ["batch", 8]}]}
    difference = "input 'input' dimension 1: 4 on v1, 8 here"
    report = {"checks": [], "compatibility": {"stable_version": 1, "compatible": False, "differences": [difference], "notes": []}}
    return add_version(model, 3, signature=signature, validation_report=report)


@pytest.fixture
def digits(db, operator) -> RegisteredModel:
    """Model ``digits``: v1 stable at 100% (generation 1), v2 ready and unrouted."""
    model = RegisteredModel.objects.create(name="digits", description="test digits")
    releases.route_first_version(add_version(model, 1), operator)
    add_version(model, 2)
    return model


@pytest.fixture
def canary_digits(digits, operator) -> RegisteredModel:
    """``digits`` with v2 as a 10% canary (its rollback target is v1 at 100%)."""
    releases.set_routes(digits, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], operator)
    return digits


def report_from(worker_id: str, *, generation: int, versions: list[dict], seconds_ago: float = 0.0, url: str = "http://worker.test") -> Worker:
    """A worker row as its latest report left it: serving the state the console issued
    as ``generation`` (its digest), when it issued one."""
    seen = timezone.now() - timezone.timedelta(seconds=seconds_ago)
    report = {"worker": {"id": worker_id}, "generation": generation, "digest": issued_digest(generation), "versions": versions}
    loaded = [{"model": entry["model"], "version": entry["version"], "routed": True} for entry in versions]
    return Worker.objects.create(
        worker_id=worker_id, host="host-a", pid=42, url=url, device="cpu", generation=generation,
        loaded=loaded, last_report=report, last_seen_at=seen,
    )


def read_silence_as_made(text: str, made_s: int = 12) -> str:
    """``text`` with a silence of ``made_s`` to ``made_s`` + 4 s read as the ``made_s`` a
    test's report was made with: the page counts from when it renders, and a loaded CI box
    has taken over half a second between the report and the render ("silent 13 s" failed a run)."""
    return re.sub(r"silent (\d+) s", lambda said: f"silent {made_s} s" if made_s <= int(said[1]) <= made_s + 4 else said[0], text)


def served(model: RegisteredModel, number: int, requests: int, *, errors: int = 0, client_errors: int = 0) -> None:
    """Traffic in this minute's roll-up of version ``number``, as ingested reports leave it."""
    live.add_to_rollup(model.versions.get(number=number), {"requests": requests, "errors": errors, "client_errors": client_errors})


def figures(number: int, requests: int = 200, *, errors: int = 0, client_errors: int = 0) -> dict:
    """One report's figures for ``digits`` v``number``: answers within 2 ms."""
    answered = requests - errors - client_errors
    return {"model": "digits", "version": number, "requests": requests, "errors": errors, "client_errors": client_errors,
            "latency_sum_s": 0.0015 * requests, "latency_buckets": {"0.001": 0, "0.002": answered, "+Inf": answered}, "batch_size_buckets": {}}


def judge_window(rollout: Rollout, canary: dict | None = None, stable: dict | None = None) -> Rollout:
    """Both sides' figures stored inside the rollout's next window, then the window judged
    at its end, as the Celery beat's tick would."""
    rollout.refresh_from_db()
    at = rollout.next_window_at
    versions = {version.number: version for version in rollout.model.versions.all()}
    samples.store("w1", [(versions[rollout.canary_version], canary or figures(rollout.canary_version)),
                         (versions[rollout.stable_version], stable or figures(rollout.stable_version))], received_at=at - timedelta(seconds=1))
    rollouts.tick(at)
    rollout.refresh_from_db()
    return rollout


def start_rollout(model: RegisteredModel, user, canary_version: int = 2, steps=(1, 10, 50, 100), step_duration_s: float = 300) -> Rollout:
    return rollouts.start(model, canary_version, list(steps), step_duration_s, {}, user)


def live_worker(model: RegisteredModel, versions: list[dict] | None = None) -> Worker:
    """A worker serving the model's current generation."""
    return report_from("w1", generation=model.current_release().generation, versions=versions or [])
