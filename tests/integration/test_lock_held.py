"""A change that needs a lock another session holds waits DATABASE_LOCK_TIMEOUT_S at
most, then is a 503 that made nothing: before, every traffic change waited as long as a
session left idle in a transaction held the generation row (45 s in a fault run), and
enough of them used up PostgreSQL's connections, so every page and report failed."""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction

from registry.models import Release, ServingGeneration
from tools.stack import running_stack

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(tmp_path, settings, model):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's lock_timeout; SQLite's writers queue on SQLITE_BUSY_TIMEOUT_S, a 503 after it too")
    with running_stack(tmp_path, settings, connection.settings_dict, DATABASE_LOCK_TIMEOUT_S="1") as stack:
        yield stack


def test_a_change_that_waits_past_the_lock_timeout_is_a_503_that_made_nothing(stack, api, model):
    releases_before = Release.objects.count()
    with transaction.atomic():
        ServingGeneration.objects.lock()  # another session holds the generation row
        started = time.monotonic()
        refused = api.post("/api/models/tiny/release/", json={"routes": [{"version": 2, "weight": 100}], "reason": "held"})
        waited_s = time.monotonic() - started

    assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
    assert refused.json()["error"].startswith("the database is busy: a lock this request needs was held by another session")
    assert waited_s < 5
    assert Release.objects.count() == releases_before
    assert api.post("/api/models/tiny/release/", json={"routes": [{"version": 2, "weight": 100}], "reason": "free"}).status_code == 201
