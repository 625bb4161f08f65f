"""Eight operators acting at once through the HTTP API of a live console, with two real
workers following: the history stays gap-free, every answer is a 201 or a clear 4xx,
and every worker ends serving the final state, proved by its digest."""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from registry.models import Release
from tools.stack import running_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

OPERATORS = 8
ACTIONS_EACH = 10
CONVERGE_WITHIN_S = 15.0


@pytest.fixture
def stack(tmp_path, settings, model):
    with running_stack(tmp_path, settings, connection.settings_dict) as stack:
        yield stack


def client_for(stack, user) -> httpx.Client:
    token, _ = Token.objects.get_or_create(user=user)
    return httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Token {token.key}"}, timeout=30)


def random_action(rng: random.Random, api: httpx.Client) -> tuple[str, str, dict]:
    """One of promote, rollback, restore or a split, sometimes decided on an older view
    (``expected_generation``), as an operator with a stale page would."""
    kind = rng.choice(["promote", "rollback", "restore", "split", "single"])
    body: dict = {}
    if rng.random() < 0.3:
        current = api.get("/api/models/tiny/release/").json()["release"]
        body["expected_generation"] = current["generation"] if current else 0
    if kind == "restore":
        return kind, "/api/models/tiny/release/restore/", {**body, "generation": rng.randint(1, 12)}
    if kind == "split":
        weight = rng.randint(1, 99)
        return kind, "/api/models/tiny/release/", {**body, "routes": [{"version": 1, "weight": 100 - weight}, {"version": 2, "weight": weight}]}
    if kind == "single":
        return kind, "/api/models/tiny/release/", {**body, "routes": [{"version": rng.choice([1, 2]), "weight": 100}]}
    return kind, f"/api/models/tiny/release/{kind}/", body


def operate(stack, user, seed: int, answers: list) -> None:
    rng = random.Random(seed)
    with client_for(stack, user) as api:
        for _ in range(ACTIONS_EACH):
            kind, path, body = random_action(rng, api)
            response = api.post(path, json=body)
            answers.append((kind, response.status_code, response.json()))
    connection.close()  # this thread's own connection (the token lookup)


def final_digests(stack, admin_user) -> tuple[str, dict[str, str | None]]:
    with client_for(stack, admin_user) as staff:
        state = staff.get("/api/serving/state").json()
        workers = staff.get("/api/workers/").json()
    return state["digest"], {row["worker_id"]: row["digest"] for row in workers}


def all_serve_the_final_state(stack, admin_user) -> bool:
    digest, workers = final_digests(stack, admin_user)
    return len(workers) == 2 and set(workers.values()) == {digest}


def test_concurrent_operators_leave_a_gap_free_history_clear_answers_and_workers_converged_by_digest(stack, operator, admin_user):
    stack.start_worker()
    stack.start_worker()
    with client_for(stack, operator) as api:
        assert wait_until(lambda: len(api.get("/api/workers/").json()) == 2, 10)
    answers: list = []
    threads = [threading.Thread(target=operate, args=(stack, operator, seed, answers)) for seed in range(OPERATORS)]

    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    print(f"{len(answers)} actions by {OPERATORS} operators in {time.monotonic() - started:.1f} s")

    assert len(answers) == OPERATORS * ACTIONS_EACH
    unclear = [(kind, status, body) for kind, status, body in answers if status != 201 and not (400 <= status < 500 and isinstance(body.get("error"), str) and body["error"])]
    assert unclear == []
    generations = list(Release.objects.order_by("generation").values_list("generation", flat=True))
    made = [body["release"]["generation"] for _, status, body in answers if status == 201]
    assert generations == list(range(1, len(generations) + 1))
    assert sorted(made) == generations[1:]  # each 201 names the one release its call made
    print(f"{len(made)} changes made, {len(answers) - len(made)} refused with a 4xx")

    assert wait_until(lambda: all_serve_the_final_state(stack, admin_user), CONVERGE_WITHIN_S, 0.2), final_digests(stack, admin_user)
    with client_for(stack, operator) as api:
        release = api.get("/api/models/tiny/release/").json()
    assert (release["release"]["generation"], release["converged"]) == (generations[-1], True)
