"""A worker is converged when the content it serves is what the console issued, proved by
the digest it reports or acks; the generation number alone proves nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from registry.fleet.state import issued_digest, issued_state
from registry.models import ServingGeneration, Worker
from serving.contract import CONTRACT_VERSION
from serving.state_signing import model_digests
from tests.console.conftest import read_silence_as_made

pytestmark = pytest.mark.django_db


@pytest.fixture
def canary(operator_client, three_versions):
    """digits at generation 2: v1 90%, v2 10%."""
    response = operator_client.post("/api/models/digits/release/", {"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}, format="json")
    assert response.json()["release"]["generation"] == 2
    return three_versions


def report(generation, digest) -> dict:
    return {"worker": {"id": "w-1", "host": "box"}, "generation": generation, "digest": digest, "epoch": ServingGeneration.objects.get().epoch,
            "contract": CONTRACT_VERSION}


def worker_row(operator_client) -> dict:
    body = operator_client.get("/api/models/digits/release/").json()
    assert len(body["workers"]) == 1
    return {"converged": body["converged"], **{key: body["workers"][0][key] for key in ("generation", "converged", "state")}}


def test_a_worker_reporting_the_generation_with_another_digest_is_not_converged(worker_client, operator_client, canary):
    worker_client.post("/api/serving/reports", report(2, issued_digest(1)), format="json")

    assert worker_row(operator_client) == {
        "converged": False, "generation": 2, "state": f"serving content this console did not issue as generation 2 (digest {issued_digest(1)[:12]}…)",
    }


def test_a_worker_reporting_the_issued_digest_of_the_generation_is_converged(worker_client, operator_client, canary):
    worker_client.post("/api/serving/reports", report(2, issued_digest(2)), format="json")

    assert worker_row(operator_client) == {"converged": True, "generation": 2, "state": "serving generation 2"}


def test_a_worker_reporting_a_generation_without_a_digest_is_not_converged(worker_client, operator_client, canary):
    worker_client.post("/api/serving/reports", report(2, None), format="json")

    assert worker_row(operator_client) == {"converged": False, "generation": 2, "state": "serving generation 2, not yet confirmed by a digest"}


def test_a_worker_proved_on_an_older_generation_is_behind(worker_client, operator_client, canary):
    worker_client.post("/api/serving/reports", report(1, issued_digest(1)), format="json")

    assert worker_row(operator_client) == {"converged": False, "generation": 1, "state": "behind: serving generation 1, the console is at generation 2"}


def test_an_ack_of_the_issued_digest_converges_a_worker_before_its_next_report(worker_client, operator_client, canary):
    worker_client.post("/api/serving/reports", report(1, issued_digest(1)), format="json")

    response = worker_client.post("/api/serving/acks", {"worker": "w-1", "generation": 2, "digest": issued_digest(2), "ok": True, "contract": CONTRACT_VERSION}, format="json")

    assert response.status_code == 204
    assert worker_row(operator_client) == {"converged": True, "generation": 2, "state": "serving generation 2"}


PARTLY = "applied but for other (keeps the routes it served before): other v2: sha256 mismatch"


def served_but_for_other(worker_client, generation: int, digits_digest: str) -> None:
    """A worker that applied ``generation`` but for model ``other``: its ack says so, and its
    report names the state it serves (a digest never issued) and digits' own digest."""
    worker_client.post("/api/serving/reports", {**report(generation, "e" * 64), "models": {"digits": digits_digest, "other": "f" * 64}},
                       format="json")
    response = worker_client.post("/api/serving/acks", {"worker": "w-1", "generation": generation, "digest": issued_digest(generation),
                                                        "ok": False, "error": PARTLY, "contract": CONTRACT_VERSION}, format="json")
    assert response.status_code == 204


def test_a_worker_serving_the_model_as_issued_is_converged_for_it_while_another_model_fails_there(worker_client, operator_client,
                                                                                              viewer_client, canary):
    served_but_for_other(worker_client, 2, model_digests(issued_state(2))["digits"])

    assert worker_row(operator_client) == {
        "converged": True, "generation": 2,
        "state": f"serving digits as issued for generation 2; {PARTLY}",
    }
    assert viewer_client.get("/api/workers/").json()[0]["converged"] is False  # the whole state is not served


def test_a_worker_serving_the_models_entry_of_an_earlier_generation_is_not_converged_for_it(worker_client, operator_client, canary):
    served_but_for_other(worker_client, 2, model_digests(issued_state(1))["digits"])

    assert worker_row(operator_client)["converged"] is False


def test_a_model_digest_from_another_epoch_converges_nothing(worker_client, operator_client, canary):
    other_epoch = {**issued_state(2).content(), "epoch": "another database"}

    served_but_for_other(worker_client, 2, model_digests(other_epoch)["digits"])

    assert worker_row(operator_client)["converged"] is False


# ---------------------------------------------------------------- workers the console cannot hear


def silence(worker_id: str, seconds: float) -> None:
    Worker.objects.filter(worker_id=worker_id).update(last_seen_at=timezone.now() - timedelta(seconds=seconds))


def two_workers_then_a_rollback(worker_client, operator_client, silent_for: float) -> dict:
    """w-1 and w-2 serve generation 2; w-2 falls silent; digits rolls back (generation 3),
    which w-1 acks."""
    for worker_id in ("w-1", "w-2"):
        worker_client.post("/api/serving/reports", {**report(2, issued_digest(2)), "worker": {"id": worker_id, "host": "box"}}, format="json")
    silence("w-2", silent_for)
    assert operator_client.post("/api/models/digits/release/rollback/", {}, format="json").json()["release"]["generation"] == 3
    worker_client.post("/api/serving/acks", {"worker": "w-1", "generation": 3, "digest": issued_digest(3), "ok": True, "contract": CONTRACT_VERSION},
                       format="json")
    return operator_client.get("/api/models/digits/release/").json()


def test_a_release_is_not_converged_while_a_recently_silent_worker_has_not_proved_it(worker_client, operator_client, canary):
    """Partitioned from the console but not from its clients, a worker answered 1,464
    requests with the rolled-away version while the release read converged."""
    body = two_workers_then_a_rollback(worker_client, operator_client, silent_for=12)

    assert [row["worker_id"] for row in body["workers"]] == ["w-1"]
    assert body["converged"] is False
    assert [(row["worker_id"], read_silence_as_made(row["state"])) for row in body["unconfirmed_silent"]] == [
        ("w-2", "silent 12 s, it last proved generation 2: frozen, cut off or dead; if it serves, it may serve what generation 3 replaced "
                "(taken for dead 60 s after its last report)")]


def test_a_worker_silent_past_a_minute_is_taken_for_dead_and_no_longer_holds_convergence(worker_client, operator_client, canary):
    body = two_workers_then_a_rollback(worker_client, operator_client, silent_for=61)

    assert (body["converged"], body["unconfirmed_silent"]) == (True, [])


def test_a_silent_worker_that_proved_the_release_before_falling_silent_does_not_hold_convergence(worker_client, operator_client, canary):
    worker_client.post("/api/serving/reports", {**report(2, issued_digest(2)), "worker": {"id": "w-2", "host": "box"}}, format="json")
    worker_client.post("/api/serving/reports", report(2, issued_digest(2)), format="json")
    silence("w-2", 12)

    body = operator_client.get("/api/models/digits/release/").json()

    assert (body["converged"], body["unconfirmed_silent"]) == (True, [])
