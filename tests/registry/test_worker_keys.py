"""A worker id belongs to the worker process that first reported under it with a key
(registry/fleet/worker_keys.py): every worker holds the same token, and an audit used it
to ack in a frozen worker's name and make a drill pass for it."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from registry.models import Worker, WorkerAck
from serving.contract import WORKER_KEY_HEADER
from tests.registry.test_api_fleet import ack, report

pytestmark = pytest.mark.django_db

REAL, FORGER = "key-of-the-real-worker", "key-of-someone-else"


def send(client, path: str, body: dict, key: str | None):
    headers = {} if key is None else {"headers": {WORKER_KEY_HEADER: key}}
    return client.post(f"/api/serving/{path}", body, format="json", **headers)


@pytest.fixture
def claimed(worker_client, three_versions):
    """Worker w-1 has reported with its key."""
    assert send(worker_client, "reports", report(), REAL).status_code == 204
    return Worker.objects.get(worker_id="w-1")


def test_the_worker_that_claimed_its_id_goes_on_reporting_and_acking(worker_client, claimed):
    assert send(worker_client, "reports", report(), REAL).status_code == 204
    assert send(worker_client, "acks", ack(1), REAL).status_code == 204


@pytest.mark.parametrize("key", [FORGER, None], ids=["another key", "no key"])
def test_a_report_under_a_claimed_id_with_another_key_or_none_is_refused_and_changes_nothing(worker_client, claimed, key):
    forged = report(generation=0, loaded=[])

    response = send(worker_client, "reports", forged, key)

    assert response.status_code == 403
    assert "belongs to the worker process that first reported under it" in response.json()["error"]
    assert Worker.objects.get(worker_id="w-1").last_report == claimed.last_report


@pytest.mark.parametrize(("key", "said"), [(FORGER, "this came with another worker key"), (None, "this came without a worker key")],
                         ids=["another key", "no key"])
def test_a_refusal_names_the_id_what_was_wrong_and_how_the_id_is_freed(worker_client, claimed, key, said):
    error = send(worker_client, "reports", report(), key).json()["error"]

    assert error == (f"worker id 'w-1' belongs to the worker process that first reported under it; {said}. Two workers may not "
                     "share an id: the id is free again once the console forgets that worker (WORKER_FORGET_AFTER_S, or "
                     "`manage.py forget_worker ID`)")


@pytest.mark.parametrize("key", [FORGER, None], ids=["another key", "no key"])
def test_an_ack_under_a_claimed_id_with_another_key_or_none_is_refused_and_stored_nowhere(worker_client, claimed, key):
    response = send(worker_client, "acks", ack(1), key)

    assert response.status_code == 403
    assert not WorkerAck.objects.exists()


@override_settings(WORKER_GONE_AFTER_S=1.0)
def test_a_gone_workers_id_is_still_refused_to_another_key(worker_client, claimed):
    # The audit's case: the real worker frozen, its id taken over to ack in its name.
    Worker.objects.filter(pk=claimed.pk).update(last_seen_at=timezone.now() - timezone.timedelta(hours=1))

    assert send(worker_client, "reports", report(), FORGER).status_code == 403
    assert send(worker_client, "acks", ack(1), FORGER).status_code == 403


def test_a_report_without_a_key_is_accepted_for_an_id_no_key_claimed_and_a_key_then_claims_it(worker_client, three_versions):
    assert send(worker_client, "reports", report(), None).status_code == 204  # a worker of an earlier version

    assert send(worker_client, "reports", report(), REAL).status_code == 204
    assert send(worker_client, "reports", report(), None).status_code == 403


def test_an_empty_key_is_no_key_it_claims_nothing_and_speaks_for_no_claimed_id(worker_client, three_versions):
    assert send(worker_client, "reports", report(), "").status_code == 204
    assert Worker.objects.get(worker_id="w-1").key_digest == ""  # unclaimed: the real worker may still claim it

    assert send(worker_client, "reports", report(), REAL).status_code == 204
    assert send(worker_client, "reports", report(), "").status_code == 403
    assert send(worker_client, "acks", ack(1), "").status_code == 403


def test_forgetting_a_worker_frees_its_id_for_a_new_key(worker_client, claimed, capsys):
    send(worker_client, "acks", ack(1), REAL)

    call_command("forget_worker", "w-1")

    assert "forgot worker 'w-1'" in capsys.readouterr().out
    assert not WorkerAck.objects.filter(worker_id="w-1").exists()  # its acks were the old process's
    assert send(worker_client, "reports", report(), FORGER).status_code == 204
    assert send(worker_client, "reports", report(), REAL).status_code == 403


def test_forgetting_an_unknown_worker_says_so():
    with pytest.raises(CommandError, match="no worker 'w-9'"):
        call_command("forget_worker", "w-9")


def test_the_console_keeps_only_a_digest_of_the_key(worker_client, claimed):
    assert REAL not in claimed.key_digest and len(claimed.key_digest) == 64


def test_a_refusal_quotes_at_most_the_first_40_characters_of_a_long_id():
    from registry.fleet import worker_keys

    holder = Worker(worker_id="x" * 100, key_digest=worker_keys.digest(REAL))

    with pytest.raises(worker_keys.KeyRefused) as refused:
        worker_keys.check(holder, "x" * 100, FORGER)

    assert f"worker id '{'x' * 40}' belongs" in str(refused.value)
