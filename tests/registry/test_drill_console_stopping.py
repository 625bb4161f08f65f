"""A drill the console begins to stop during (``registry.process_stop``, marked as uvicorn
closes its socket on SIGTERM): from then on no worker is heard, so the drill ends its wait,
says the console stopped, blames no worker for the silence and still rolls forward. The
console's real stop is tests/integration/test_drill_console_stop.py; here the stop is
marked by hand at a chosen moment, and workers are threads speaking the worker API."""

from __future__ import annotations

import time

import pytest

from registry import process_stop
from registry.models import Drill, Release
from tests.registry.conftest import in_thread, wait_for_generation
from tests.registry.test_drill_confirmation import ack, report
from tests.registry.test_drill_summary import PARTLY

pytestmark = pytest.mark.django_db(transaction=True)

DRILL_WAIT_S = 3  # DRILL_ACK_TIMEOUT_S
STOPPED = "the console stopped during the drill (it stopped taking the workers' reports and acks "


@pytest.fixture
def canary(operator_client, three_versions, settings, monkeypatch):
    """digits at generation 2 (a canary split); a drill rolls back to generation 3. The
    console runs: the mark of its stop is undone after the test."""
    monkeypatch.setattr(process_stop, "_began_at", None)
    settings.DRILL_ACK_TIMEOUT_S = DRILL_WAIT_S
    # Quiet for half of it, a worker reads as "fell silent after confirming": 1 s (0.5 s quiet)
    # failed a test whose thread took 0.5 s from its confirming report to the stop it marks.
    settings.WORKER_GONE_AFTER_S = 3.0
    split = {"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}
    operator_client.post("/api/models/digits/release/", split, format="json")
    return three_versions


def test_a_drill_the_console_stops_during_names_the_stop_not_the_workers_it_could_not_hear(worker_client, operator_client, canary):
    report(worker_client, 2, "w-1")
    report(worker_client, 2, "w-2")

    def one_confirms_the_other_acks_then_the_console_stops():
        wait_for_generation(3)
        assert ack(worker_client, 3, worker_id="w-1") == 204 and report(worker_client, 3, "w-1") == 204
        assert ack(worker_client, 3, worker_id="w-2") == 204  # its report would come next: the console is gone by then
        process_stop.mark_stopping()

    worker = in_thread(one_confirms_the_other_acks_then_the_console_stops)
    started = time.monotonic()
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    answered_s = time.monotonic() - started
    worker.join(15)

    assert drill["status"] == "failed"
    reasons = drill["error"].split("; ")
    assert reasons[0].startswith(STOPPED), drill["error"]
    assert reasons[0].endswith(", so it could not be measured: 1 of 2 workers were seen serving generation 3 before that")
    assert reasons[1].startswith("not yet seen: w-2 (acked at ") and reasons[1].endswith(" s, no report since)")
    assert "never confirmed" not in drill["error"] and "fell silent" not in drill["error"]
    rows = {row["worker"]: row for row in drill["workers"]}
    assert rows["w-1"]["confirmed_s"] is not None and rows["w-1"]["error"] == "" and rows["w-1"]["quiet_after_confirming"] == ""
    assert rows["w-1"]["failed_requests"] == 0  # counted: it was heard until the stop
    assert rows["w-2"]["ok"] is True and rows["w-2"]["confirmed_s"] is None
    assert rows["w-2"]["error"].startswith("not seen: the console stopped taking reports and acks ")
    assert rows["w-2"]["error"].endswith(" s after the click, before a report showed it serving generation 3")
    # Rolled forward at once: no ack could reach a stopping console, and none was waited for.
    assert answered_s < DRILL_WAIT_S
    assert drill["forward_generation"] == 4 and drill["forward_unconfirmed"] == []
    assert reasons[-1].startswith("rolled forward to generation 4, but the console stopped during the drill (it stopped taking the workers' acks ")
    assert reasons[-1].endswith("), so whether 2 of 2 workers followed it was not watched: w-1, w-2")
    assert Release.objects.filter(model__name="digits").order_by("-generation").first().action == "restore"


def test_a_console_stop_during_the_roll_forward_counts_no_worker_as_not_following_it(worker_client, operator_client, canary):
    report(worker_client, 2)

    def follow_then_the_console_stops_before_the_roll_forward_is_acked():
        wait_for_generation(3)
        assert ack(worker_client, 3) == 204 and report(worker_client, 3) == 204
        wait_for_generation(4)
        process_stop.mark_stopping()  # the worker's ack of generation 4 finds no console

    worker = in_thread(follow_then_the_console_stops_before_the_roll_forward_is_acked)
    started = time.monotonic()
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    answered_s = time.monotonic() - started
    worker.join(15)

    assert drill["status"] == "passed"  # measured in full before the stop
    assert drill["forward_generation"] == 4 and drill["forward_unconfirmed"] == []
    assert drill["error"].startswith("rolled forward to generation 4, but the console stopped during the drill (it stopped taking the workers' acks ")
    assert drill["error"].endswith("), so whether 1 of 1 workers followed it was not watched: w-1")
    assert answered_s < DRILL_WAIT_S
    assert Drill.objects.get().finished_at is not None


def test_a_worker_that_acked_a_failure_before_the_console_stopped_is_still_named_for_it(worker_client, operator_client, canary):
    report(worker_client, 2, "w-1")
    report(worker_client, 2, "w-2")

    def one_fails_the_other_is_unheard():
        wait_for_generation(3)
        assert ack(worker_client, 3, ok=False, error="artifact download timed out", worker_id="w-1") == 204
        assert ack(worker_client, 3, worker_id="w-2") == 204
        process_stop.mark_stopping()

    worker = in_thread(one_fails_the_other_is_unheard)
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(15)

    assert drill["status"] == "failed"
    reasons = drill["error"].split("; ")
    assert reasons[0].startswith(STOPPED) and reasons[0].endswith("0 of 2 workers were seen serving generation 3 before that")
    assert reasons[1].startswith("not yet seen: w-2 (acked at ")
    assert reasons[2].startswith("1 of 2 workers never confirmed serving generation 3: w-1 (failed to apply"), drill["error"]
    rows = {row["worker"]: row for row in drill["workers"]}
    assert rows["w-1"]["error"].startswith("failed to apply")


def test_a_worker_that_applied_the_rollback_but_for_another_model_is_not_blamed_for_the_console_s_stop(worker_client, operator_client,
                                                                                                         canary):
    """Its rows said "applied generation 3 but for other, …, and no report proved digits
    served as issued" where the cause was the console's own stop (a fault run, SIGTERM 0.3 s in)."""
    report(worker_client, 2)

    def apply_but_for_another_model_then_the_console_stops():
        wait_for_generation(3)
        assert ack(worker_client, 3, ok=False, error=PARTLY) == 204
        process_stop.mark_stopping()

    worker = in_thread(apply_but_for_another_model_then_the_console_stops)
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(15)

    assert drill["status"] == "failed"
    assert drill["error"].startswith(STOPPED) and "never confirmed" not in drill["error"], drill["error"]
    assert "; not yet seen: w-1 (acked at " in drill["error"]
    error = drill["workers"][0]["error"]
    assert error.startswith("not seen: the console stopped taking reports and acks "), error
    assert error.endswith(f" s after the click, before a report showed it serving generation 3 (its ack: {PARTLY})")
    assert drill["forward_unconfirmed"] == []
