"""A change committed just before the database goes away is answered as made, never as a
503 that invites the retry which would make it twice (a second promote, a second
rollback). The loss is forced at the database boundary: once a release row is committed,
every query on the connection fails as a lost server connection does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import OperationalError, connection, transaction
from django.test import Client

from registry.models import Release, Rollout

pytestmark = pytest.mark.django_db(transaction=True)  # the change must really commit


@contextmanager
def database_lost_after_a_release_commits() -> Iterator[None]:
    lost = {"connection": False}

    def fail_once_committed(execute, sql, params, many, context):
        if lost["connection"]:
            raise OperationalError("server closed the connection unexpectedly")
        result = execute(sql, params, many, context)
        if sql.startswith('INSERT INTO "registry_release"'):
            # Registered before the change's own callbacks (the publish), so it runs first.
            transaction.on_commit(lambda: lost.update(connection=True))
        return result

    with connection.execute_wrapper(fail_once_committed):
        yield


@pytest.fixture
def browser(operator) -> Client:
    client = Client(raise_request_exception=False)  # what a browser gets: handler500's answers included
    client.force_login(operator)
    return client


def test_a_promote_whose_answer_the_database_cuts_short_is_a_201_naming_the_release_it_made(operator_client, canary_digits):
    with database_lost_after_a_release_commits():
        response = operator_client.post("/api/models/digits/release/promote/", {"reason": "ship v2"}, format="json")

    assert response.status_code == 201
    body = response.json()
    assert body["release"]["generation"] == 3
    assert body["release"]["action"] == "promote"
    assert body["release"]["routes"] == [{"version": 2, "weight": 100}]
    assert "database became unavailable right after this change was committed" in body["warning"]
    assert "Retry-After" not in response
    assert Release.objects.filter(model=canary_digits, generation=3, action="promote").exists()


def test_a_committed_rollout_start_cut_short_says_it_was_made_and_asks_for_no_retry(operator_client, digits):
    with database_lost_after_a_release_commits():
        response = operator_client.post("/api/models/digits/rollouts/", {"canary_version": 2, "reason": "try v2"}, format="json")

    rollout = Rollout.objects.get(model=digits)
    assert response.status_code == 503
    assert "Retry-After" not in response
    assert response.json()["committed"] == f"digits: rollout {rollout.pk} started (generation {rollout.release_generation})"
    assert "do not repeat it" in response.json()["error"]


def test_a_form_change_whose_message_cannot_be_saved_shows_it_was_made_not_try_again(browser, canary_digits):
    with database_lost_after_a_release_commits():
        response = browser.post("/models/digits/promote/", {"reason": "ship v2", "expected_generation": 2})

    page = response.content.decode()
    assert response.status_code == 503
    assert "Retry-After" not in response
    assert "Your change was made" in page
    assert "digits: Generation 3: traffic is now" in page
    assert "Do not submit the change again" in page
    assert Release.objects.filter(model=canary_digits, generation=3).exists()


def test_a_change_the_database_refuses_before_its_commit_is_still_a_503_to_retry(operator_client, canary_digits):
    def fail_the_release_insert(execute, sql, params, many, context):
        if sql.startswith('INSERT INTO "registry_release"'):
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(fail_the_release_insert):
        response = operator_client.post("/api/models/digits/release/promote/", {"reason": "ship v2"}, format="json")

    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert not Release.objects.filter(model=canary_digits, generation=3).exists()


@pytest.fixture
def connection_lost_at_commit(monkeypatch):
    """The server writes the COMMIT and the connection goes before its reply: psycopg
    raises the error it raises for a commit that never arrived, so the outcome is unknown."""
    commit = connection._commit

    def commit_then_lose_the_connection():
        commit()
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(connection, "_commit", commit_then_lose_the_connection)


def test_a_change_whose_commit_loses_the_connection_is_answered_in_doubt_not_retry(operator_client, canary_digits, connection_lost_at_commit):
    response = operator_client.post("/api/models/digits/release/promote/", {"reason": "ship v2"}, format="json")

    assert response.status_code == 503
    assert "Retry-After" not in response
    assert response.json()["in_doubt"] == "digits: generation 3"
    assert "may or may not have been made" in response.json()["error"]


def test_a_form_change_whose_commit_loses_the_connection_says_it_may_have_been_made(browser, canary_digits, connection_lost_at_commit):
    response = browser.post("/models/digits/promote/", {"reason": "ship v2", "expected_generation": 2})

    assert response.status_code == 503
    assert "Retry-After" not in response
    assert "Your change may or may not have been made" in response.content.decode()
    assert "digits: generation 3" in response.content.decode()


class LockNotAvailable(Exception):
    """As psycopg raises it when lock_timeout passes (DATABASE_LOCK_TIMEOUT_S)."""

    sqlstate = "55P03"


def test_a_lock_that_times_out_after_the_release_is_written_is_a_503_that_made_nothing_not_in_doubt(operator_client, canary_digits):
    # The release row is noted pending, then the model's rollouts are locked: a lock wait is
    # never the COMMIT, so the change was certainly not made.
    written = []

    def time_out_on_the_rollouts_lock(execute, sql, params, many, context):
        written.extend([1] if sql.startswith('INSERT INTO "registry_release"') else [])
        if written and 'FROM "registry_rollout"' in sql:  # SELECT … FOR UPDATE on PostgreSQL
            raise OperationalError("canceling statement due to lock timeout") from LockNotAvailable()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(time_out_on_the_rollouts_lock):
        response = operator_client.post("/api/models/digits/release/promote/", {"reason": "ship v2"}, format="json")

    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert "in_doubt" not in response.json()
    assert response.json()["error"].startswith("the database is busy: a lock this request needs was held")
    assert not Release.objects.filter(model=canary_digits, generation=3).exists()
