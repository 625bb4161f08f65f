"""A failed drill says every reason it failed in its summary (``error``), not only inside
``workers[]``: slow acks with their figures, failed requests (at least so many when a
worker's count is unknown), and which workers never confirmed; its audit entry says so
too. The workers here are threads speaking the worker API (acks and reports with
the worker token), as in tests/registry/test_api_fleet.py."""

from __future__ import annotations

import re
import threading
import time

import pytest
from django.db import connection

from registry.fleet.state import issued_digest, issued_state
from registry.models import Release, ServingGeneration
from serving.contract import CONTRACT_VERSION, MAX_COUNT
from serving.state_signing import model_digests
from tests.registry.conftest import in_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def canary(operator_client, three_versions):
    """digits at generation 2 (a canary split); a drill rolls back to generation 3."""
    operator_client.post("/api/models/digits/release/", {"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}, format="json")
    return three_versions


def report(worker_id: str, generation: int, failed_total: int) -> dict:
    return {"worker": {"id": worker_id, "host": "box"}, "generation": generation, "digest": issued_digest(generation),
            "epoch": ServingGeneration.objects.get().epoch, "requests_failed_total": failed_total, "contract": CONTRACT_VERSION}


def follow_rollback(worker_client, worker_id: str, *, delay_s: float, failed_total: int) -> threading.Thread:
    """A worker that acks generation 3 ``delay_s`` after it exists, then reports serving it,
    then acks the drill's roll forward (generation 4), which the drill waits for."""

    def ack(generation: int, after_s: float = 0.0) -> None:
        deadline = time.monotonic() + 10
        while not Release.objects.filter(generation=generation).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(after_s)
        worker_client.post("/api/serving/acks", {"worker": worker_id, "generation": generation, "digest": issued_digest(generation),
                                                 "ok": True, "contract": CONTRACT_VERSION}, format="json")

    def run():
        try:
            ack(3, delay_s)
            worker_client.post("/api/serving/reports", report(worker_id, 3, failed_total), format="json")
            ack(4)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def run_drill(operator_client, followers) -> dict:
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    for follower in followers:
        follower.join(15)
    return drill


def test_a_drill_with_slow_acks_says_how_slow_against_the_target(worker_client, operator_client, canary, settings):
    settings.DRILL_TARGET_S, settings.DRILL_ACK_TIMEOUT_S = 0.1, 5
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0.3, failed_total=0)])

    assert drill["status"] == "failed"
    assert re.fullmatch(r"acks slower than the target of 0\.1 s: w-1 \d+\.\d\d s", drill["error"]), drill["error"]
    assert float(drill["error"].split()[-2]) == pytest.approx(drill["last_ack_s"], abs=0.005)


def test_a_drill_with_failed_requests_says_how_many(worker_client, operator_client, canary, settings):
    settings.DRILL_ACK_TIMEOUT_S = 5
    worker_client.post("/api/serving/reports", report("w-1", 2, 10), format="json")

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=13)])

    assert (drill["status"], drill["failed_requests"], drill["error"]) == ("failed", 3, "3 request(s) failed during the drill")


def test_a_drill_whose_workers_count_more_failures_than_a_column_holds_still_finishes_and_rolls_forward(
        worker_client, operator_client, canary, settings):
    # A worker token's holder (two ids of its own) reported 2**40 failed requests during a
    # drill on PostgreSQL: the sum failed the drill's write (its column held 2**31 - 1), the
    # drill answered 500 and stayed running, the rollback in force and no roll forward made.
    # Here the sum passes 2**63 - 1, which SQLite's integers do not hold either.
    settings.DRILL_ACK_TIMEOUT_S = 5
    for worker_id in ("w-1", "w-2"):
        worker_client.post("/api/serving/reports", report(worker_id, 2, 0), format="json")

    drill = run_drill(operator_client, [follow_rollback(worker_client, worker_id, delay_s=0, failed_total=2**62) for worker_id in ("w-1", "w-2")])

    assert (drill["status"], drill["failed_requests"], drill["error"]) == ("failed", MAX_COUNT, f"{MAX_COUNT} request(s) failed during the drill")
    assert Release.objects.order_by("-generation").values_list("generation", "action").first() == (4, "restore")


def test_a_failed_drill_states_every_reason_in_its_summary(worker_client, operator_client, canary, settings):
    settings.DRILL_TARGET_S, settings.DRILL_ACK_TIMEOUT_S = 0.1, 1.5
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")
    worker_client.post("/api/serving/reports", report("w-2", 2, 0), format="json")

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0.3, failed_total=2)])  # w-2 never acks

    assert drill["status"] == "failed"
    reasons = drill["error"].split("; ")
    assert reasons[0] == "1 of 2 workers never confirmed serving generation 3: w-2 (no ack before the timeout)"
    assert re.fullmatch(r"acks slower than the target of 0\.1 s: w-1 \d+\.\d\d s", reasons[1]), reasons
    assert reasons[2:] == ["at least 2 request(s) failed during the drill (unknown for 1 worker(s): w-2)"]


def test_a_passed_drill_has_no_error(worker_client, operator_client, canary, settings):
    settings.DRILL_ACK_TIMEOUT_S = 5
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=0)])

    assert (drill["status"], drill["error"]) == ("passed", "")


@pytest.mark.parametrize("status", ["running", "waiting_for_data"])
def test_a_drill_says_it_left_a_running_rollout_paused(worker_client, operator_client, three_versions, operator, settings, status):
    # The drill's rollback is a manual traffic change, which pauses a running rollout; the
    # roll forward restored the split and left the rollout paused, with nothing said (and,
    # for a rollout waiting for data, still nothing said after the first fix).
    from registry.actions import rollouts
    from registry.models import Rollout

    settings.DRILL_ACK_TIMEOUT_S = 5
    rollout = rollouts.start(three_versions, 2, [10, 50, 100], 300, {}, operator)  # generation 2: v2 at 10 %
    Rollout.objects.filter(pk=rollout.pk).update(status=status)
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=0)])

    assert drill["status"] == "passed"
    assert drill["error"] == f"rollout #{rollout.pk} was paused by the drill's rollback and stays paused until it is resumed"


def test_a_drill_whose_wait_is_shorter_than_its_target_reports_the_wait_as_its_target(worker_client, operator_client, canary, settings):
    # DRILL_TARGET_S (60 s) could never apply: the drill stops waiting at DRILL_ACK_TIMEOUT_S,
    # and a worker following in 12 s failed as "no ack" beside a reported target of 60 s.
    settings.DRILL_TARGET_S, settings.DRILL_ACK_TIMEOUT_S = 60, 2
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=0)])

    assert (drill["status"], drill["target_s"]) == ("passed", 2)


def test_a_drill_with_a_worker_whose_failures_are_unknown_has_no_failed_request_total(worker_client, operator_client, canary, settings):
    # The total summed the known counts only: a drill with a silent worker said "0 failed requests".
    settings.DRILL_ACK_TIMEOUT_S = 1.5
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")
    worker_client.post("/api/serving/reports", report("w-2", 2, 0), format="json")

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=0)])  # w-2 never acks

    assert (drill["status"], drill["failed_requests"]) == ("failed", None)


def test_a_passed_drill_says_which_workers_failed_requests_it_could_not_count(worker_client, operator_client, canary, settings):
    settings.DRILL_ACK_TIMEOUT_S = 5
    uncounted = {key: value for key, value in report("w-1", 2, 0).items() if key != "requests_failed_total"}
    worker_client.post("/api/serving/reports", uncounted, format="json")

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=0)])

    assert (drill["status"], drill["failed_requests"]) == ("passed", None)
    assert drill["error"] == "failed requests not counted for 1 worker(s), whose reports carry no failure counter: w-1"


def drill_audit_message(operator_client) -> str:
    events = operator_client.get("/api/models/digits/audit/", {"kind": "drill"}).json()
    return events[0]["message"]


def test_a_failed_drill_s_audit_entry_says_why_it_failed(worker_client, operator_client, canary, settings):
    settings.DRILL_ACK_TIMEOUT_S = 0.3
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")

    drill = run_drill(operator_client, [])  # w-1 never acks

    assert drill_audit_message(operator_client) == (
        "Rollback drill failed: 1 of 1 workers never confirmed serving generation 3: w-1 (no ack before the timeout). "
        "Last ack none, failed requests unknown")
    assert drill["status"] == "failed"


def test_a_drill_s_result_is_in_the_console_s_log(worker_client, operator_client, canary, settings, caplog):
    settings.DRILL_ACK_TIMEOUT_S = 0.3
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")

    with caplog.at_level("INFO", logger="registry.actions.drills"):
        drill = run_drill(operator_client, [])  # w-1 never acks

    results = [(record.levelname, record.getMessage()) for record in caplog.records if record.getMessage().startswith("drill #")]
    assert results == [("WARNING", f"drill #{drill['id']} of digits failed (generation 2 to 3): {drill['error']}")]


def test_a_passed_drill_s_result_is_an_info_line_in_the_console_s_log(worker_client, operator_client, canary, settings, caplog):
    settings.DRILL_ACK_TIMEOUT_S = 5
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")

    with caplog.at_level("INFO", logger="registry.actions.drills"):
        drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=0)])

    results = [(record.levelname, record.getMessage()) for record in caplog.records if record.getMessage().startswith("drill #")]
    assert results == [("INFO", f"drill #{drill['id']} of digits passed (generation 2 to 3)")]


def test_a_failed_drill_s_audit_entry_counts_failed_requests_as_at_least_when_some_are_unknown(worker_client, operator_client, canary,
                                                                                              settings):
    settings.DRILL_ACK_TIMEOUT_S = 1.5
    worker_client.post("/api/serving/reports", report("w-1", 2, 10), format="json")
    worker_client.post("/api/serving/reports", report("w-2", 2, 0), format="json")

    run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=12)])  # w-2 never acks

    assert drill_audit_message(operator_client).endswith("Last ack none, at least 2 failed requests (unknown for 1 of 2 workers)")


PARTLY = "applied but for other (keeps the routes it served before): other v2: sha256 mismatch"


def ack_partly_when_released(worker_client, worker_id: str, generation: int, error: str) -> None:
    """Once ``generation`` exists, the worker acks it ``ok: false`` with ``error``."""
    deadline = time.monotonic() + 10
    while not Release.objects.filter(generation=generation).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    worker_client.post("/api/serving/acks", {"worker": worker_id, "generation": generation, "digest": issued_digest(generation),
                                             "ok": False, "error": error, "contract": CONTRACT_VERSION}, format="json")


def test_a_worker_that_applied_the_rollback_but_fails_another_model_is_named_so_not_as_failing_to_apply(worker_client, operator_client,
                                                                                                        canary, settings):
    """'failed to apply: applied but for other …' read as 'the rollback never reached the
    workers', where it served at once (an operator's drill, one model broken elsewhere)."""
    settings.DRILL_ACK_TIMEOUT_S = 1
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")

    drill = run_drill(operator_client, [in_thread(lambda: ack_partly_when_released(worker_client, "w-1", 3, PARTLY))])

    assert drill["status"] == "failed"
    assert drill["workers"][0]["error"] == (
        "applied generation 3 but for other, which fails on it, and no report proved digits served as issued (by its digest) "
        "before the timeout (other v2: sha256 mismatch)")
    assert "failed to apply" not in drill["error"]


def partly_applied(worker_client, worker_id: str, *, digits_digest, forward_error: str = PARTLY) -> threading.Thread:
    """A worker that applies generation 3 but for model ``other`` (its canary broken there):
    it acks so, reports serving the state it could (a digest the console never issued) with
    ``digits`` at ``digits_digest(3)``, then does the same for the roll forward (4), whose
    ack says ``forward_error``."""

    def follow(generation: int, error: str) -> None:
        ack_partly_when_released(worker_client, worker_id, generation, error)
        served = {**report(worker_id, generation, 0), "digest": "e" * 64, "models": {"digits": digits_digest(generation), "other": "f" * 64}}
        worker_client.post("/api/serving/reports", served, format="json")

    return in_thread(lambda: (follow(3, PARTLY), follow(4, forward_error)))


def digits_as_issued(generation: int) -> str:
    return model_digests(issued_state(generation))["digits"]


def test_a_worker_whose_report_proves_the_drilled_model_by_its_digest_passes_the_drill_while_another_model_fails_there(
        worker_client, operator_client, canary, settings):
    settings.DRILL_ACK_TIMEOUT_S = 3
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")

    drill = run_drill(operator_client, [partly_applied(worker_client, "w-1", digits_digest=digits_as_issued)])

    assert drill["status"] == "passed", drill["error"]
    row = drill["workers"][0]
    assert (row["error"], row["generation"], row["model_digest"]) == ("", 3, digits_as_issued(3))
    assert row["confirmed_s"] is not None
    assert drill["error"] == ("1 worker(s) serve the rollback of digits, proved by its digest, but not the whole state: w-1 (applied "
                              "but for other (keeps the routes it served before): other v2: sha256 mismatch)")
    assert drill["forward_generation"] == 4


def test_a_report_with_the_drilled_models_digest_of_another_generation_does_not_confirm_it(worker_client, operator_client, canary,
                                                                                           settings):
    """The canary split's entry (generation 2) reported under generation 3 is not the rollback."""
    settings.DRILL_ACK_TIMEOUT_S = 3
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")

    drill = run_drill(operator_client, [partly_applied(worker_client, "w-1", digits_digest=lambda generation: digits_as_issued(2))])

    assert drill["status"] == "failed"
    assert drill["workers"][0]["confirmed_s"] is None
    assert "no report proved digits served as issued (by its digest)" in drill["workers"][0]["error"]


def test_a_roll_forward_ack_saying_the_drilled_model_failed_is_not_counted_as_following_it(worker_client, operator_client, canary,
                                                                                          settings):
    settings.DRILL_ACK_TIMEOUT_S = 3
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")
    failed = "applied but for digits (keeps the routes it served before): digits v2: sha256 mismatch"

    drill = run_drill(operator_client, [partly_applied(worker_client, "w-1", digits_digest=digits_as_issued, forward_error=failed)])

    assert drill["status"] == "passed"
    assert drill["error"].endswith(f"rolled forward to generation 4, but 1 of 1 workers did not follow it within 3 s: w-1 ({failed})")


def test_a_report_of_an_earlier_generation_with_its_own_model_digest_does_not_confirm_the_rollback(worker_client, operator_client,
                                                                                                   canary, settings):
    """digits as issued at generation 2 (the canary split), named under generation 2."""
    settings.DRILL_ACK_TIMEOUT_S = 3
    worker_client.post("/api/serving/reports", report("w-1", 2, 0), format="json")

    def follow():
        ack_partly_when_released(worker_client, "w-1", 3, PARTLY)
        stale = {**report("w-1", 2, 0), "digest": "e" * 64, "models": {"digits": digits_as_issued(2)}}
        worker_client.post("/api/serving/reports", stale, format="json")

    drill = run_drill(operator_client, [in_thread(follow)])

    assert drill["status"] == "failed"
    assert drill["workers"][0]["confirmed_s"] is None
