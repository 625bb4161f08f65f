"""A worker that has applied no state yet still reports, and the console lists it as the
worker that needs attention: not converged, with its state in words."""

from __future__ import annotations

from datetime import timedelta

import pytest

from registry.fleet.state import issued_digest
from registry.models import ServingGeneration, Worker
from serving.contract import CONTRACT_VERSION

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_marks_of_other_tests(settings):
    """A console that has issued nothing yet. Every test's counter starts under the same
    epoch, and marks in Redis (and this process's memory of them) outlive a test: another
    test's mark of that epoch made a report past the counter read as no restore's, in
    whichever order the tests ran."""
    import redis

    from registry.fleet import issued_mark, workers

    issued_mark._noted.clear()
    workers._SEEN.clear()
    if settings.REDIS_URL:
        with redis.Redis.from_url(settings.REDIS_URL) as client:
            for key in client.scan_iter(f"{settings.CHANNEL_LAYER_PREFIX}:issued:*"):
                client.delete(key)


def stateless_report() -> dict:
    return {"worker": {"id": "w-new", "host": "box", "pid": 7, "url": "http://127.0.0.1:9", "device": "cpu"},
            "generation": None, "digest": None, "epoch": None, "loaded": [], "versions": [], "contract": CONTRACT_VERSION}


# What serving/reports.py sends before any state is applied: generation 0 and no digest
# (the console also takes the contract's null).
AS_THE_WORKER_SENDS_IT = {"generation": 0, "digest": None}
NO_STATE_SHAPES = pytest.mark.parametrize("shape", [{}, AS_THE_WORKER_SENDS_IT], ids=["null", "as-the-worker-sends-it"])


def listed(viewer_client) -> list[tuple]:
    return [(row["worker_id"], row["generation"], row["digest"], row["converged"], row["state"]) for row in viewer_client.get("/api/workers/").json()]


@NO_STATE_SHAPES
def test_a_report_of_a_worker_with_no_state_yet_is_accepted(worker_client, three_versions, shape):
    response = worker_client.post("/api/serving/reports", {**stateless_report(), **shape}, format="json")

    assert response.status_code == 204
    assert Worker.objects.get().worker_id == "w-new"


@NO_STATE_SHAPES
def test_a_worker_with_no_state_yet_is_listed_as_not_converged(worker_client, viewer_client, three_versions, shape):
    worker_client.post("/api/serving/reports", {**stateless_report(), **shape}, format="json")

    assert listed(viewer_client) == [("w-new", 0, None, False, "no state applied yet")]


@NO_STATE_SHAPES
def test_a_worker_with_no_state_yet_counts_against_a_models_convergence(worker_client, viewer_client, three_versions, shape):
    worker_client.post("/api/serving/reports", {**stateless_report(), **shape}, format="json")

    body = viewer_client.get("/api/models/digits/release/").json()

    assert (body["converged"], [(row["worker_id"], row["converged"], row["state"]) for row in body["workers"]]) == (
        False, [("w-new", False, "no state applied yet")],
    )


def test_a_worker_serving_the_current_state_is_listed_as_converged(worker_client, viewer_client, three_versions):
    epoch = ServingGeneration.objects.get().epoch
    worker_client.post("/api/serving/reports", {**stateless_report(), "generation": 1, "digest": issued_digest(1), "epoch": epoch}, format="json")

    assert listed(viewer_client) == [("w-new", 1, issued_digest(1), True, "serving generation 1")]


def listed_all(viewer_client) -> list[tuple]:
    rows = viewer_client.get("/api/workers/?all=1").json()
    return [(row["worker_id"], row["lifecycle"], row["converged"], row["state"]) for row in rows]


def serving_generation_1(**extra) -> dict:
    epoch = ServingGeneration.objects.get().epoch
    return {**stateless_report(), "generation": 1, "digest": issued_digest(1), "epoch": epoch, **extra}


def test_a_worker_that_said_it_stopped_is_listed_as_serving_nothing_not_as_behind(worker_client, operator_client, viewer_client,
                                                                                  three_versions):
    worker_client.post("/api/serving/reports", serving_generation_1(), format="json")
    operator_client.post("/api/models/digits/release/", {"routes": [{"version": 2, "weight": 100}]}, format="json")
    worker_client.post("/api/serving/reports", serving_generation_1(state="stopped"), format="json")

    assert listed_all(viewer_client) == [("w-new", "stopped", False, "stopped: it last served generation 1")]


def test_a_worker_that_said_it_stopped_is_listed_with_nothing_loaded(worker_client, viewer_client, three_versions):
    loaded = [{"model": "digits", "version": 1, "routed": True, "ready": True}]
    worker_client.post("/api/serving/reports", serving_generation_1(loaded=loaded), format="json")
    assert viewer_client.get("/api/workers/?all=1").json()[0]["loaded"] == loaded

    worker_client.post("/api/serving/reports", serving_generation_1(loaded=loaded, state="stopped"), format="json")

    assert viewer_client.get("/api/workers/?all=1").json()[0]["loaded"] == []


def test_a_gone_worker_is_listed_as_gone_not_as_converged(worker_client, viewer_client, three_versions, settings):
    worker_client.post("/api/serving/reports", serving_generation_1(), format="json")
    Worker.objects.update(last_seen_at=Worker.objects.get().last_seen_at - timedelta(seconds=settings.WORKER_GONE_AFTER_S + 1))

    assert listed_all(viewer_client) == [("w-new", "gone", False, "gone: it last served generation 1")]


@pytest.mark.parametrize("nul_at", ["key", "value", "nested"])
def test_a_report_with_a_nul_character_anywhere_is_refused_and_nothing_recorded(worker_client, viewer_client, nul_at):
    """Reports are stored as sent, and PostgreSQL's JSON cannot hold NUL: a 400, not a 500."""
    extra = {"key": {"odd\u0000key": 1}, "value": {"note": "a\u0000b"}, "nested": {"shadow": [{"model": ["x", {"y": "\u0000"}]}]}}[nul_at]

    response = worker_client.post("/api/serving/reports", {**stateless_report(), **extra}, format="json")

    assert (response.status_code, response.json()["error"]) == (400, "a report must not contain NUL (\\u0000) characters")
    assert Worker.objects.count() == 0


def lifecycles(viewer_client, **params) -> dict[str, str]:
    return {row["worker_id"]: row["lifecycle"] for row in viewer_client.get("/api/workers/", params).json()}


def test_a_worker_whose_last_report_says_stopped_is_listed_stopped_at_once_and_not_live(worker_client, viewer_client):
    worker_client.post("/api/serving/reports", {**stateless_report(), "state": "stopped"}, format="json")

    assert lifecycles(viewer_client) == {}
    assert lifecycles(viewer_client, all="1") == {"w-new": "stopped"}


def test_a_draining_worker_is_still_live_and_listed_draining(worker_client, viewer_client):
    worker_client.post("/api/serving/reports", {**stateless_report(), "state": "draining"}, format="json")

    assert lifecycles(viewer_client) == {"w-new": "draining"}


def test_a_worker_silent_past_gone_after_is_gone_not_stopped(worker_client, viewer_client, settings):
    worker_client.post("/api/serving/reports", stateless_report(), format="json")
    Worker.objects.update(last_seen_at=Worker.objects.get().last_seen_at - timedelta(seconds=settings.WORKER_GONE_AFTER_S + 1))

    assert lifecycles(viewer_client, all="1") == {"w-new": "gone"}


def test_a_report_without_a_state_keeps_a_worker_live(worker_client, viewer_client):
    report = stateless_report()
    worker_client.post("/api/serving/reports", report, format="json")
    Worker.objects.update(last_report={key: value for key, value in report.items() if key != "state"})  # as an older worker left it

    assert lifecycles(viewer_client) == {"w-new": "serving"}


@pytest.mark.parametrize(("loaded", "words"), [
    ([{"model": "digits", "version": 1}] * 4097, "loaded: must have at most 4096 items"),
    ([{"model": "x" * 101, "version": 1}], "loaded[0].model: must be a model name (1 to 100 letters, digits, - or _)"),
    ([{"model": "digits\u202e", "version": 1}], "loaded[0].model: must be a model name"),
    ([{"model": "digits", "version": 0}], "loaded[0].version"),
])
def test_a_report_whose_loaded_list_is_too_long_or_names_no_model_is_refused_and_stores_nothing(worker_client, loaded, words):
    # 66,000 entries took the console 3.8 s a report, and any string passed as a model name.
    response = worker_client.post("/api/serving/reports", {**stateless_report(), "loaded": loaded}, format="json")

    assert response.status_code == 400
    assert words in response.json()["error"]
    assert Worker.objects.count() == 0


@pytest.mark.parametrize("state", ["gone", "STOPPED", 0, {"state": "stopped"}])
def test_a_report_with_a_state_the_contract_does_not_know_is_refused_and_stores_nothing(worker_client, state):
    response = worker_client.post("/api/serving/reports", {**stateless_report(), "state": state}, format="json")

    assert response.status_code == 400
    assert "state: must be one of serving, draining, stopped" in response.json()["error"]
    assert Worker.objects.count() == 0


def test_a_stopped_worker_that_reports_serving_again_is_live_again(worker_client, viewer_client):
    worker_client.post("/api/serving/reports", {**stateless_report(), "state": "stopped"}, format="json")
    worker_client.post("/api/serving/reports", stateless_report(), format="json")  # the same id, restarted

    assert lifecycles(viewer_client) == {"w-new": "serving"}


# ---- a counter that went back (the database restored from a backup) ----------------------


def counter() -> tuple[int, str]:
    row = ServingGeneration.objects.get()
    return row.generation, row.epoch


def test_a_worker_serving_a_generation_past_the_counter_renews_the_epoch(worker_client, three_versions):
    # Restored to generation N, the console issues N+1… again under the same epoch, and every
    # state signed before the restore above N stays a push a worker takes as newer.
    generation, epoch = counter()
    before_restore = {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32, "epoch": epoch}

    assert worker_client.post("/api/serving/reports", before_restore, format="json").status_code == 204

    renewed = worker_client.get("/api/serving/state").json()
    assert (renewed["generation"], counter()[0]) == (generation, generation)
    assert renewed["epoch"] not in ("", epoch) and counter()[1] == renewed["epoch"]


def test_a_worker_at_or_below_the_counter_keeps_the_epoch(worker_client, three_versions):
    generation, epoch = counter()
    report = {**stateless_report(), "generation": generation, "digest": issued_digest(generation), "epoch": epoch}

    assert worker_client.post("/api/serving/reports", report, format="json").status_code == 204

    assert counter() == (generation, epoch)


def test_a_worker_of_another_epoch_past_the_counter_keeps_the_epoch(worker_client, three_versions):
    # Another database's states: its numbers say nothing of this counter's.
    generation, epoch = counter()
    report = {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32, "epoch": "0" * 16}

    assert worker_client.post("/api/serving/reports", report, format="json").status_code == 204

    assert counter() == (generation, epoch)


def test_after_the_epoch_is_renewed_the_worker_past_the_counter_is_not_converged_until_it_takes_the_new_state(
        worker_client, viewer_client, three_versions):
    generation, epoch = counter()
    worker_client.post("/api/serving/reports", {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32,
                                                "epoch": epoch}, format="json")
    state = worker_client.get("/api/serving/state").json()

    assert [row[3] for row in listed(viewer_client)] == [False]
    worker_client.post("/api/serving/reports", {**stateless_report(), "generation": state["generation"], "digest": state["digest"],
                                                "epoch": state["epoch"]}, format="json")
    assert [row[1:4] for row in listed(viewer_client)] == [(state["generation"], state["digest"], True)]


def test_an_epoch_a_renewal_minted_is_not_renewed_again_by_reports_alone(worker_client, three_versions):
    # A worker-token holder read each new epoch and reported past it: six epochs in a row,
    # and the real workers' acks of each refused.
    generation, _ = counter()
    for attempt in range(3):
        epoch = counter()[1]
        worker_client.post("/api/serving/reports", {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32,
                                                    "epoch": epoch}, format="json")
        if attempt == 0:
            renewed = counter()[1]

    assert counter() == (generation, renewed)


def test_an_epoch_a_renewal_minted_is_not_renewed_again_by_reports_to_another_console_process(worker_client, three_versions):
    # What a renewal minted was kept in the minting process's memory: reports sent to two
    # console processes in turn renewed the epoch at every one (80 epochs in 20 s).
    from registry.fleet import workers

    generation, _ = counter()

    def report_past_the_counter_to_another_process() -> None:
        workers._SEEN.clear()  # a process that has read nothing before
        worker_client.post("/api/serving/reports", {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32,
                                                    "epoch": counter()[1]}, format="json")

    report_past_the_counter_to_another_process()
    renewed = counter()[1]
    report_past_the_counter_to_another_process()
    report_past_the_counter_to_another_process()

    assert counter() == (generation, renewed)


def test_a_restore_to_the_counter_a_renewal_minted_its_epoch_at_is_seen_by_a_restarted_console(worker_client, operator_client,
                                                                                                 three_versions):
    # Kept in the database alone, a restore to a backup taken at the renewal (states issued
    # above it since) looked like a token holder's report once the console had restarted.
    from registry.fleet import workers

    generation, _ = counter()
    worker_client.post("/api/serving/reports", {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32,
                                                "epoch": counter()[1]}, format="json")
    renewed = counter()[1]
    operator_client.post("/api/models/digits/release/", {"routes": [{"version": 2, "weight": 100}]}, format="json")
    assert worker_client.get("/api/serving/state").json()["generation"] == generation + 1  # issued to the workers
    ServingGeneration.objects.update(generation=generation)  # the restore
    workers._SEEN.clear()  # and the console restarted

    worker_client.post("/api/serving/reports", {**stateless_report(), "generation": generation + 1, "digest": "ab" * 32,
                                                "epoch": renewed}, format="json")

    assert counter()[1] not in ("", renewed)


def test_without_redis_to_say_what_was_issued_the_counters_row_still_stops_a_renewal_repeated(worker_client, three_versions, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    generation, first = counter()
    past = {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32}

    worker_client.post("/api/serving/reports", {**past, "epoch": first}, format="json")
    renewed = counter()[1]
    worker_client.post("/api/serving/reports", {**past, "epoch": renewed}, format="json")

    assert counter() == (generation, renewed)


def test_a_highest_issued_mark_that_is_no_number_is_unknown_not_a_500(worker_client, three_versions, settings):
    import redis

    generation, epoch = counter()
    key = f"{settings.CHANNEL_LAYER_PREFIX}:issued:{epoch}"
    with redis.Redis.from_url(settings.REDIS_URL) as client:
        client.set(key, "notint")  # what anyone with Redis could write
        try:
            response = worker_client.post("/api/serving/reports", {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32,
                                                                   "epoch": epoch}, format="json")
        finally:
            client.delete(key)

    assert response.status_code == 204
    assert counter()[1] != epoch  # unknown is "maybe issued past the counter", so the epoch is renewed, as with no Redis


@pytest.mark.parametrize("forged", ["1000000000", "1000000000:" + "0" * 64])
def test_a_mark_someone_with_redis_set_past_every_report_does_not_renew_the_epoch_at_each_one(worker_client, three_versions, settings,
                                                                                               forged):
    # A worker's environment holds the Redis password: with it and the worker token an
    # attacker set the mark past each report and renewed the epoch at every one (131 in 25 s).
    import redis

    from registry.fleet import issued_mark

    issued_mark._noted.clear()
    generation, first = counter()
    worker_client.get("/api/serving/state")  # issued: the console marks it
    with redis.Redis.from_url(settings.REDIS_URL) as client:
        renewed = []
        for _ in range(3):
            epoch = counter()[1]
            key = f"{settings.CHANNEL_LAYER_PREFIX}:issued:{epoch}"
            client.set(key, forged)
            worker_client.post("/api/serving/reports", {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32,
                                                        "epoch": epoch}, format="json")
            client.delete(key)
            renewed.append(counter()[1] != epoch)

    assert renewed.count(True) <= 1  # once, as with no Redis at all: the mark proves nothing


def test_a_mark_the_console_wrote_still_stops_a_report_that_claims_a_generation_never_issued(worker_client, three_versions):
    from registry.fleet import issued_mark

    issued_mark._noted.clear()  # a process that has marked nothing yet (another test's mark of this epoch may be gone)
    generation, epoch = counter()
    worker_client.get("/api/serving/state")  # the console marks the generation it answers

    worker_client.post("/api/serving/reports", {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32, "epoch": epoch},
                       format="json")

    assert counter() == (generation, epoch)


def test_a_report_past_the_counter_after_a_traffic_change_renews_nothing_when_no_state_past_it_was_issued(
        worker_client, operator_client, three_versions):
    # Checked only while the counter stood where the renewal left it, every traffic change
    # let a token holder renew the epoch once more.
    generation, _ = counter()
    worker_client.post("/api/serving/reports", {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32,
                                                "epoch": counter()[1]}, format="json")
    for version in (2, 1):
        made = operator_client.post("/api/models/digits/release/", {"routes": [{"version": version, "weight": 100}]}, format="json")
        assert made.status_code == 201, made.content
        state = worker_client.get("/api/serving/state").json()  # issued to the workers
        worker_client.post("/api/serving/reports", {**stateless_report(), "generation": state["generation"] + 5, "digest": "ab" * 32,
                                                    "epoch": state["epoch"]}, format="json")

        assert counter() == (state["generation"], state["epoch"])


def test_an_epoch_a_renewal_minted_is_renewed_again_when_its_counter_goes_back_from_what_was_seen(worker_client, operator_client,
                                                                                                  three_versions):
    # Restored to a backup taken after the renewal, before the changes since: their states stay valid pushes.
    generation, _ = counter()
    past = {**stateless_report(), "generation": generation + 40, "digest": "ab" * 32}
    worker_client.post("/api/serving/reports", {**past, "epoch": counter()[1]}, format="json")
    renewed = counter()[1]
    operator_client.post("/api/models/digits/release/", {"routes": [{"version": 2, "weight": 100}]}, format="json")
    worker_client.post("/api/serving/reports", {**stateless_report(), "epoch": renewed}, format="json")  # the console sees it
    ServingGeneration.objects.update(generation=generation)  # the restore

    worker_client.post("/api/serving/reports", {**past, "epoch": renewed}, format="json")

    assert counter()[1] not in ("", renewed)
