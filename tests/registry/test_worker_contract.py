"""The console refuses acks and reports of another contract version (serving/contract.py)
whole, with a 400 naming the versions, before reading any other field."""

from __future__ import annotations

import pytest

from registry.fleet.state import issued_digest
from registry.models import Worker, WorkerAck
from serving.contract import CONTRACT_VERSION, Ack, WorkerIdentity, WorkerReport

pytestmark = pytest.mark.django_db

V = CONTRACT_VERSION
OTHER_VERSIONS = [({"contract": V + 1}, f"the message speaks contract {V + 1}, this side speaks contract {V}"),
                  ({"contract": str(V)}, f"the message speaks contract '{V}', this side speaks contract {V}"),
                  ({"contract": None}, f"missing: this side speaks contract {V}, the message names none")]


def report(generation: int = 1) -> dict:
    return WorkerReport(worker=WorkerIdentity("w-1", "box"), generation=generation, digest=issued_digest(generation)).to_dict()


def ack(generation: int = 1) -> dict:
    return Ack(worker="w-1", generation=generation, digest=issued_digest(generation), ok=True).to_dict()


@pytest.mark.parametrize(("change", "reason"), OTHER_VERSIONS)
def test_a_report_of_another_contract_version_is_refused_naming_it_and_nothing_is_recorded(worker_client, three_versions, change, reason):
    response = worker_client.post("/api/serving/reports", {**report(), **change}, format="json")

    assert response.status_code == 400
    assert response.json() == {"error": f"contract: {reason}"}
    assert Worker.objects.count() == 0


@pytest.mark.parametrize(("change", "reason"), OTHER_VERSIONS)
def test_an_ack_of_another_contract_version_is_refused_naming_it_and_nothing_is_stored(worker_client, three_versions, change, reason):
    worker_client.post("/api/serving/reports", report(), format="json")

    response = worker_client.post("/api/serving/acks", {**ack(), **change}, format="json")

    assert response.status_code == 400
    assert response.json() == {"error": f"contract: {reason}"}
    assert WorkerAck.objects.count() == 0
    assert Worker.objects.get().ok is True  # the ack changed nothing about the worker


def test_the_contract_version_is_judged_before_the_shape(worker_client, three_versions):
    """A message of another version may have any shape: the refusal names the version, not a field it lacks."""
    response = worker_client.post("/api/serving/reports", {"worker": "w-1", "contract": CONTRACT_VERSION + 1}, format="json")

    assert response.status_code == 400
    assert response.json() == {"error": f"contract: the message speaks contract {V + 1}, this side speaks contract {V}"}


def test_a_report_and_an_ack_of_this_contract_version_are_taken(worker_client, three_versions):
    assert worker_client.post("/api/serving/reports", report(), format="json").status_code == 204
    assert worker_client.post("/api/serving/acks", ack(), format="json").status_code == 204

    assert WorkerAck.objects.get().generation == 1
