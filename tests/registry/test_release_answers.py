"""A traffic action answers with the release it made, even when another operator's change
commits before the answer is built.

The other change is real: a second thread, on its own database connection, commits a
release right after the call's own commit (hooked on the publish step, which runs on
commit, before the view builds its answer).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from registry.actions import releases
from registry.fleet import publish
from registry.models import Release

pytestmark = pytest.mark.django_db(transaction=True)
SPLIT = {"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}


@pytest.fixture
def another_change_after_each_commit(monkeypatch, three_versions, admin_user):
    """After the first commit the test makes through the API, another operator commits a
    change of their own; returns the generations they made."""
    real_publish = publish.publish_desired_state
    made: list[int] = []
    armed = threading.Event()

    def other_operator() -> None:
        try:
            routes = [{"version": 3, "weight": 100}]  # valid after any of the actions
            made.append(releases.set_routes(three_versions, routes, admin_user, "the other operator").generation)
        finally:
            connection.close()

    def publish_then_race() -> None:
        real_publish()
        if armed.is_set():
            armed.clear()
            thread = threading.Thread(target=other_operator)
            thread.start()
            thread.join(10)

    monkeypatch.setattr(publish, "publish_desired_state", publish_then_race)
    return armed, made


ACTIONS = {
    "set routes": (None, "/api/models/digits/release/", SPLIT),
    "promote": (SPLIT, "/api/models/digits/release/promote/", {}),
    "rollback": (SPLIT, "/api/models/digits/release/rollback/", {}),
    "restore": (SPLIT, "/api/models/digits/release/restore/", {"generation": 1}),
}


@pytest.mark.parametrize("action", ACTIONS)
def test_a_traffic_action_answers_with_the_release_it_made_not_a_later_one(operator_client, another_change_after_each_commit, action):
    armed, made = another_change_after_each_commit
    before, path, body = ACTIONS[action]
    if before is not None:
        assert operator_client.post("/api/models/digits/release/", before, format="json").status_code == 201
    created = Release.objects.order_by("-generation").first().generation + 1
    armed.set()

    response = operator_client.post(path, body, format="json")

    assert response.status_code == 201
    assert made == [created + 1]  # the other change did commit before the answer
    answered = response.json()["release"]
    mine = Release.objects.get(generation=created)
    assert (answered["generation"], answered["action"], answered["actor"], answered["routes"]) == (created, mine.action, "olivia", mine.routes)
