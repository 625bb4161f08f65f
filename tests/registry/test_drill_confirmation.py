"""What confirms a drill's rollback: a worker's ok ack and a report of a state in which
the rollback is in force. A failed apply that the worker's retry fixed still confirms; a
later change of the model, which the worker may have gone straight to, does not, and the
drill then does not roll forward over it. Workers here are threads speaking the worker API."""

from __future__ import annotations

import re
import time
from functools import partial

import pytest
from django.test import Client

from registry.fleet.state import issued_digest
from registry.models import Drill, Release, ServingGeneration, WorkerAck
from serving.contract import CONTRACT_VERSION
from tests.fixtures.personas import _client_for
from tests.registry.conftest import in_thread, wait_for_generation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def canary(operator_client, three_versions, settings):
    """digits at generation 2 (a canary split); a drill rolls back to generation 3."""
    settings.DRILL_ACK_TIMEOUT_S = 3
    split = {"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}
    operator_client.post("/api/models/digits/release/", split, format="json")
    return three_versions


def ack(client, generation: int, ok: bool = True, error: str = "", worker_id: str = "w-1") -> int:
    body = {"worker": worker_id, "generation": generation, "digest": issued_digest(generation), "ok": ok, "contract": CONTRACT_VERSION}
    if error:
        body["error"] = error
    return client.post("/api/serving/acks", body, format="json").status_code


def report(client, generation: int, worker_id: str = "w-1", pid: int | None = None, failed: int = 0) -> int:
    identity = {"id": worker_id, "host": "box", **({"pid": pid} if pid is not None else {})}
    return client.post("/api/serving/reports", {
        "worker": identity, "generation": generation, "digest": issued_digest(generation),
        "epoch": ServingGeneration.objects.get().epoch, "requests_failed_total": failed, "contract": CONTRACT_VERSION,
    }, format="json").status_code


def test_a_worker_whose_retry_applied_the_rollback_confirms_the_drill(worker_client, operator_client, canary):
    report(worker_client, 2)

    def fail_then_retry():
        wait_for_generation(3)
        assert ack(worker_client, 3, ok=False, error="artifact download timed out") == 204
        time.sleep(0.3)
        assert ack(worker_client, 3) == 204
        assert report(worker_client, 3) == 204
        wait_for_generation(4)  # the roll forward
        ack(worker_client, 4)

    worker = in_thread(fail_then_retry)
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(15)

    assert (drill["status"], drill["error"]) == ("passed", "")
    assert drill["workers"][0]["ok"] is True and drill["workers"][0]["confirmed_s"] is not None
    assert WorkerAck.objects.get(worker_id="w-1", generation=3).ok  # the ack history agrees with the worker's row


def test_a_repeated_failed_ack_does_not_undo_an_ok_one(worker_client, canary):
    report(worker_client, 2)

    assert ack(worker_client, 2) == 204
    assert ack(worker_client, 2, ok=False, error="late duplicate") == 204

    assert WorkerAck.objects.get(worker_id="w-1", generation=2).ok


def test_a_later_change_of_the_model_does_not_confirm_the_rollback_and_is_not_rolled_over(worker_client, operator_client, operator, canary):
    report(worker_client, 2)
    other_operator = _client_for(operator)

    def change_then_follow_only_the_change():
        wait_for_generation(3)
        even = {"routes": [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]}
        changed = other_operator.post("/api/models/digits/release/", even, format="json")
        assert changed.status_code == 201, changed.content
        assert ack(worker_client, 4) == 204  # straight to the operator's change: the rollback was never served
        assert report(worker_client, 4) == 204

    worker = in_thread(change_then_follow_only_the_change)
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(15)

    assert drill["status"] == "failed"
    reasons = drill["error"].split("; ")
    assert reasons[0].startswith("1 of 1 workers never confirmed serving generation 3: w-1")
    assert "another change of digits (generation 4) replaced the rollback during the drill" in reasons[1]
    assert reasons[-1] == "not rolled forward: digits changed during the drill (generation 4), and that change stands"
    current = Release.objects.filter(model__name="digits").order_by("-generation").first()
    assert (current.generation, [(r["version"], r["weight"]) for r in current.routes]) == (4, [(1, 50), (2, 50)])
    assert Drill.objects.get().finished_at is not None


def follow_the_rollback_at_once(worker_client):
    """Worker w-1 acks and reports the drill's rollback (generation 3) as soon as it is made."""
    wait_for_generation(3)
    ack(worker_client, 3)
    report(worker_client, 3)


def test_a_worker_that_never_answers_does_not_delay_the_others_confirmation(worker_client, operator_client, canary, settings):
    report(worker_client, 2)
    silent = {"worker": {"id": "w-silent", "host": "box"}, "generation": 2, "digest": issued_digest(2),
              "epoch": ServingGeneration.objects.get().epoch, "requests_failed_total": 0, "contract": CONTRACT_VERSION}
    assert worker_client.post("/api/serving/reports", silent, format="json").status_code == 204

    worker = in_thread(partial(follow_the_rollback_at_once, worker_client))
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(15)

    rows = {row["worker"]: row for row in drill["workers"]}
    assert re.fullmatch(r"no ack before the timeout: it has not reported for 3\.\d s \(its last report came 0\.\d s before the click\)",
                        rows["w-silent"]["error"]), rows["w-silent"]["error"]
    # Confirmed as soon as its report came, not after the silent worker's whole timeout (3 s).
    assert rows["w-1"]["confirmed_s"] < settings.DRILL_ACK_TIMEOUT_S / 2, rows["w-1"]


def test_a_drill_one_worker_never_confirmed_gives_no_time_to_confirm_the_rollback(worker_client, operator_client, canary):
    # The drill's "confirmed in" is when the last worker confirmed: the first worker's time
    # alone read as the fleet's, on a drill a silent worker failed.
    report(worker_client, 2)
    report(worker_client, 2, worker_id="w-silent")

    worker = in_thread(partial(follow_the_rollback_at_once, worker_client))
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(15)

    rows = {row["worker"]: row for row in drill["workers"]}
    assert rows["w-1"]["confirmed_s"] is not None and rows["w-silent"]["confirmed_s"] is None
    assert (drill["status"], drill["confirmed_s"]) == ("failed", None)


def test_a_drill_says_what_was_applied_by_digest_not_only_by_number(worker_client, operator_client, canary):
    report(worker_client, 2)

    def follow():
        wait_for_generation(3)
        ack(worker_client, 3)
        report(worker_client, 3)
        wait_for_generation(4)
        ack(worker_client, 4)

    worker = in_thread(follow)
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(15)

    assert drill["status"] == "passed"
    assert (drill["to_generation"], drill["to_digest"]) == (3, issued_digest(3))
    assert (drill["forward_generation"], drill["forward_unconfirmed"]) == (4, [])
    assert (drill["workers"][0]["generation"], drill["workers"][0]["digest"]) == (3, issued_digest(3))


def drill_whose_roll_forward_w1_misses(worker_client, operator_client) -> dict:
    """A drill whose only worker follows the rollback, then freezes before the roll forward."""
    report(worker_client, 2)

    def follow_the_rollback_then_freeze():
        wait_for_generation(3)
        ack(worker_client, 3)
        report(worker_client, 3)

    worker = in_thread(follow_the_rollback_then_freeze)
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(15)
    return drill


def test_a_roll_forward_a_worker_never_acked_is_said_in_the_drill_not_only_made(worker_client, operator_client, canary, settings):
    # The drill said "rolled forward" after waiting out DRILL_ACK_TIMEOUT_S for acks that
    # never came, and recorded the wait nowhere.
    drill = drill_whose_roll_forward_w1_misses(worker_client, operator_client)

    assert (drill["status"], drill["forward_generation"]) == ("passed", 4)
    assert drill["error"] == f"rolled forward to generation 4, but 1 of 1 workers did not follow it within {settings.DRILL_ACK_TIMEOUT_S:g} s: w-1 (no ack)"


def test_a_passed_drill_whose_roll_forward_a_worker_missed_says_so_beside_passed_on_every_page(worker_client, operator_client, operator,
                                                                                                 canary):
    # "Passed" is the rollback's result; with the roll forward missed the fleet is left split,
    # and a tired operator reading the badge alone took the drill for a clean one.
    drill = drill_whose_roll_forward_w1_misses(worker_client, operator_client)

    assert (drill["status"], drill["forward_unconfirmed"]) == ("passed", ["w-1"])
    pages = Client()
    pages.force_login(operator)
    missed = "roll forward not followed by 1</span>"
    for page in ("/drills/", f"/drills/{drill['id']}/", "/models/digits/"):
        assert missed in pages.get(page).content.decode(), page
    assert "not followed by w-1 when the drill ended" in pages.get(f"/drills/{drill['id']}/").content.decode()


def test_a_worker_restarted_under_its_id_during_the_drill_fails_it_and_its_failures_are_not_taken_as_zero(worker_client, operator_client, canary):
    """Killed after its ack and started again under the same id, the worker confirmed from
    its new process, whose count began at 0: the drill passed with 0 failed requests while
    its clients had met a closed port (595 refused connections in a fault run)."""
    assert report(worker_client, 2, pid=100, failed=40) == 204

    def ack_then_restart():
        wait_for_generation(3)
        assert ack(worker_client, 3) == 204  # the old process
        time.sleep(0.3)
        assert report(worker_client, 3, pid=200) == 204  # the new one
        wait_for_generation(4)
        ack(worker_client, 4)

    worker = in_thread(ack_then_restart)
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    worker.join(15)

    assert drill["status"] == "failed"
    assert "1 of 1 workers restarted during the drill: w-1 (pid 100 → 200); requests sent to them meanwhile failed uncounted" in drill["error"]
    assert (drill["workers"][0]["restarted"], drill["workers"][0]["failed_requests"], drill["failed_requests"]) == ("pid 100 → 200", None, None)


def test_a_worker_silent_after_confirming_fails_the_drill_and_its_failures_are_unknown(worker_client, operator_client, canary, settings):
    """Killed just after it confirmed, a worker's last count stood: the drill passed with
    "0 failed" while its clients were refused 381 times (a fault helper's run)."""
    settings.WORKER_GONE_AFTER_S = 1.0  # quiet past half of it by the measure's end
    for worker_id in ("w-1", "w-2"):
        assert report(worker_client, 2, worker_id, pid=7) == 204

    def confirm_then_die():
        wait_for_generation(3)
        assert ack(worker_client, 3) == 204 and report(worker_client, 3, pid=7) == 204  # and then nothing

    def keep_reporting_then_confirm_late():
        wait_for_generation(3)
        for _ in range(5):
            time.sleep(0.3)
            report(worker_client, 2, "w-2", pid=7)
        assert ack(worker_client, 3, worker_id="w-2") == 204 and report(worker_client, 3, "w-2", pid=7) == 204
        wait_for_generation(4)
        ack(worker_client, 4, worker_id="w-2")

    threads = [in_thread(confirm_then_die), in_thread(keep_reporting_then_confirm_late)]
    drill = operator_client.post("/api/models/digits/drills/", {}, format="json").json()
    for thread in threads:
        thread.join(15)

    assert drill["status"] == "failed"
    rows = {row["worker"]: row for row in drill["workers"]}
    assert rows["w-1"]["confirmed_s"] is not None and rows["w-1"]["failed_requests"] is None
    assert rows["w-1"]["quiet_after_confirming"].startswith("it ")
    assert "1 of 2 workers fell silent after confirming the rollback: w-1 (it " in drill["error"]
    assert rows["w-2"]["quiet_after_confirming"] == ""
