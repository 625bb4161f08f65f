"""The desired state is one consistent snapshot: its routes are those of its generation.

The race is forced, not hoped for: a hook on the reading connection
(``connection.execute_wrapper``, Django's own) lets a concurrent writer on its own
connection commit a real release after every query the state read makes, so a change
lands between any two of its reads.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
from django.db import connection

from registry.actions import releases
from registry.fleet.state import state_at
from registry.models import Release, ServingGeneration
from serving.contract import CONTRACT_VERSION
from serving.state_signing import state_digest
from tests.fixtures.personas import _client_for

pytestmark = pytest.mark.django_db(transaction=True)
WRITER_TIMEOUT_S = 10


class ConcurrentWriter:
    """A thread that commits one traffic change each time it is asked, and says when it
    has committed. Every change routes a split no earlier release had."""

    def __init__(self, model):
        self.model = model
        self.asked, self.done = threading.Event(), threading.Event()
        self.stopped = False
        self.committed: list[int] = []
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def commit_one(self) -> None:
        self.done.clear()
        self.asked.set()
        assert self.done.wait(WRITER_TIMEOUT_S), "the concurrent writer did not commit in time"

    def stop(self) -> None:
        self.stopped = True
        self.asked.set()
        self.thread.join(WRITER_TIMEOUT_S)

    def _run(self) -> None:
        try:
            while self.asked.wait(WRITER_TIMEOUT_S * 3) and not self.stopped:
                self.asked.clear()
                try:
                    canary_weight = len(self.committed) % 98 + 1
                    routes = [{"version": 1, "weight": 100 - canary_weight}, {"version": 2 + len(self.committed) % 2, "weight": canary_weight}]
                    self.committed.append(releases.set_routes(self.model, routes, None, "concurrent writer").generation)
                except BaseException as error:  # noqa: BLE001 - reported by the test
                    self.errors.append(error)
                finally:
                    self.done.set()
        finally:
            connection.close()  # this thread's own connection


@contextmanager
def a_release_committed_after_each_registry_read(model):
    """While active, every query of this thread's connection on a registry table is
    followed by a release committed on another connection, before the next query runs."""
    writer = ConcurrentWriter(model)

    def commit_after(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith("SELECT") and "registry_" in sql:
            writer.commit_one()
        return result

    try:
        with connection.execute_wrapper(commit_after):
            yield writer
    finally:
        writer.stop()
    assert writer.errors == []


def routes_of(state_model: dict) -> list[dict]:
    return [{key: route[key] for key in ("version", "weight")} for route in state_model["routes"]]


def newest_routes_at_or_below(model, generation: int) -> list[dict] | None:
    release = Release.objects.filter(model=model, generation__lte=generation).order_by("-generation").first()
    return None if release is None else release.routes


def test_a_state_read_while_releases_commit_between_its_reads_has_the_routes_of_its_generation(three_versions, admin_user):
    with a_release_committed_after_each_registry_read(three_versions) as writer:
        response = _client_for(admin_user).get("/api/serving/state")
    state = response.json()

    assert response.status_code == 200
    assert writer.committed and max(writer.committed) > state["generation"]  # changes did land after its counter read
    assert routes_of(state["models"]["digits"]) == newest_routes_at_or_below(three_versions, state["generation"])
    assert state["models"]["digits"]["generation"] == Release.objects.filter(generation__lte=state["generation"]).order_by("-generation").first().generation
    assert state["digest"] == state_digest(state) == state_at(state["generation"], ServingGeneration.objects.get().epoch)["digest"]


def test_a_torn_state_is_never_taken_as_converged(three_versions, admin_user, settings):
    """What the old two-query read produced: generation N with the routes of N-1. A worker
    that applied it acks and reports a digest the console never issued for N."""
    from rest_framework.test import APIClient

    releases.set_routes(three_versions, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}], None)
    epoch = ServingGeneration.objects.get().epoch
    torn = {**state_at(1, epoch), "generation": 2}
    torn.pop("digest")
    torn_digest = state_digest(torn)
    worker = APIClient()
    worker.credentials(HTTP_AUTHORIZATION=f"Bearer {settings.SERVING_WORKER_TOKEN}")
    report = {"worker": {"id": "w-torn", "host": "box"}, "generation": 2, "digest": torn_digest, "epoch": epoch, "contract": CONTRACT_VERSION}

    assert worker.post("/api/serving/reports", report, format="json").status_code == 204
    ack = worker.post("/api/serving/acks", {"worker": "w-torn", "generation": 2, "digest": torn_digest, "ok": True, "contract": CONTRACT_VERSION}, format="json")
    release = _client_for(admin_user).get("/api/models/digits/release/").json()

    assert ack.status_code == 400
    assert (release["converged"], [row["converged"] for row in release["workers"]]) == (False, [False])
