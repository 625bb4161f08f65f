"""Which workers a drill measures. A worker silent for a moment before the drill (frozen
with SIGSTOP, paused) still holds its port and must follow: an operator found a drill
passing because a worker froze 5.1 s before it, past WORKER_GONE_AFTER_S, where 4.9 s
failed it. Workers gone longer are not measured, and the summary names only those the
Workers page still lists, not every dead id until retention forgets it. The workers
here are threads speaking the worker API, as in test_drill_summary.py."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from registry.models import Worker
from serving.contract import CONTRACT_VERSION
from tests.registry.test_drill_summary import follow_rollback, report, run_drill

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def canary(operator_client, three_versions, settings):
    """digits at generation 2 (a canary split); a drill rolls back to generation 3."""
    settings.DRILL_ACK_TIMEOUT_S = 1.5
    split = {"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}
    operator_client.post("/api/models/digits/release/", split, format="json")
    return three_versions


def reported(worker_client, worker_id: str, silent_for_s: float = 0, **extra) -> datetime:
    """``worker_id`` reported serving generation 2, ``silent_for_s`` ago; when it was seen last."""
    assert worker_client.post("/api/serving/reports", {**report(worker_id, 2, 0), **extra}, format="json").status_code == 204
    seen = timezone.now() - timedelta(seconds=silent_for_s)
    Worker.objects.filter(worker_id=worker_id).update(last_seen_at=seen)
    return seen


def silent_as_made(said: float, silent_for_s: float, seen: datetime) -> bool:
    """A silence said (to 0.1 s) as the one a test made: ``silent_for_s`` when it was made,
    and at most the time since then, which a loaded CI box stretches (over a second
    between a test's report and its drill's click would have read "8.0 s" for 7)."""
    return silent_for_s - 0.05 <= said <= (timezone.now() - seen).total_seconds() + 0.05


def test_a_worker_silent_shortly_before_the_drill_fails_it_when_it_does_not_follow(worker_client, operator_client, canary, settings):
    reported(worker_client, "w-1")
    frozen_s = settings.WORKER_GONE_AFTER_S + 2
    seen = reported(worker_client, "w-frozen", silent_for_s=frozen_s)

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=0)])

    assert drill["status"] == "failed"
    said = re.fullmatch(r"1 of 2 workers never confirmed serving generation 3: "
                        r"w-frozen \(silent (\d+\.\d) s before the drill; no ack before the timeout\)", drill["error"])
    assert said and silent_as_made(float(said[1]), frozen_s, seen), drill["error"]


def test_a_worker_silent_shortly_before_the_drill_that_follows_it_passes_with_its_silence_on_its_row_and_in_the_summary(
        worker_client, operator_client, canary, settings):
    # A frozen worker's drill read "passed" with nothing said: its clients' requests waited for it.
    reported(worker_client, "w-1")
    frozen_s = settings.WORKER_GONE_AFTER_S + 2
    seen = reported(worker_client, "w-thawed", silent_for_s=frozen_s)

    followers = [follow_rollback(worker_client, worker_id, delay_s=0, failed_total=0) for worker_id in ("w-1", "w-thawed")]
    drill = run_drill(operator_client, followers)

    rows = {row["worker"]: row for row in drill["workers"]}
    assert (drill["status"], sorted(rows)) == ("passed", ["w-1", "w-thawed"])
    assert rows["w-1"]["silent_before_s"] is None
    assert silent_as_made(rows["w-thawed"]["silent_before_s"], frozen_s, seen), rows["w-thawed"]
    said = re.fullmatch(r"1 worker\(s\) silent as the drill began followed it, but requests sent to them meanwhile waited and are "
                        r"not among the failed: w-thawed \(silent (\d+\.\d) s, confirmed at \d+\.\d s\)", drill["error"])
    assert said and float(said[1]) == rows["w-thawed"]["silent_before_s"], drill["error"]


def test_a_drill_whose_console_stalled_past_its_wait_says_so_rather_than_blame_the_workers_alone(worker_client, operator_client, canary,
                                                                                                 settings, monkeypatch):
    # The console SIGSTOPped 15 s mid-drill: every worker "never confirmed", nothing about the console.
    from registry.actions import drills

    watch = drills.watch_workers

    def stalled(*args, **kwargs):
        time.sleep(settings.DRILL_ACK_TIMEOUT_S + 3)
        return watch(*args, **kwargs)

    monkeypatch.setattr(drills, "watch_workers", stalled)
    reported(worker_client, "w-1")

    drill = run_drill(operator_client, [])

    assert drill["status"] == "failed"
    assert re.search(r"; the console itself stalled: its wait for the workers ended \d\.\d s past the 1\.5 s it allows \(its "
                     r"process or its database paused\)", drill["error"]), drill["error"]


def test_a_worker_gone_longer_before_the_drill_is_named_as_not_measured_and_does_not_fail_it(worker_client, operator_client, canary):
    reported(worker_client, "w-1")
    reported(worker_client, "w-old", silent_for_s=30 * 60)

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=0)])

    assert (drill["status"], [row["worker"] for row in drill["workers"]]) == ("passed", ["w-1"])
    assert drill["error"] == "not measured: 1 worker gone before the drill (last report between 60 s and 1 h before it): w-old"
    assert drill["not_measured"] == ["w-old"]


def test_a_passed_drill_that_did_not_measure_a_gone_worker_says_so_beside_passed(worker_client, operator_client, operator, canary):
    # A frozen worker past WORKER_GONE_AFTER_S still held its port; the drill read a green
    # "Passed" with its note in the summary alone.
    from django.test import Client

    reported(worker_client, "w-1")
    reported(worker_client, "w-old", silent_for_s=30 * 60)
    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=0)])
    pages = Client()
    pages.force_login(operator)

    for page in ("/drills/", f"/drills/{drill['id']}/", "/models/digits/"):
        assert "1 not measured</span>" in pages.get(page).content.decode(), page


def test_a_worker_gone_over_an_hour_before_the_drill_is_not_named(worker_client, operator_client, canary):
    # Every restart reports under a new id: the dead ones were named in every drill for a day.
    reported(worker_client, "w-1")
    reported(worker_client, "w-dead", silent_for_s=2 * 3600)

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=0)])

    assert (drill["status"], drill["error"]) == ("passed", "")


def test_a_worker_that_said_it_stopped_is_never_a_participant(worker_client, operator_client, canary, settings):
    reported(worker_client, "w-1")
    reported(worker_client, "w-stopped", silent_for_s=settings.WORKER_GONE_AFTER_S + 2, state="stopped", contract=CONTRACT_VERSION)

    drill = run_drill(operator_client, [follow_rollback(worker_client, "w-1", delay_s=0, failed_total=0)])

    assert (drill["status"], [row["worker"] for row in drill["workers"]], drill["error"]) == ("passed", ["w-1"], "")
