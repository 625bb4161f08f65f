"""A drill's page (/drills/{id}/): how long every worker took to follow, the digest each
confirmed, its failed requests and the drill's words on it, with the summary in full; the
Drills table and the model page's last-drill panel link to it. The drills here are run by
``registry.actions.drills.run_drill``, with workers answering from its ``made`` callback
(called once its rollback is committed), so each row is what a real drill writes."""

from __future__ import annotations

import html as html_module
from datetime import timedelta

import pytest
from django.utils import timezone

from registry.actions import drills
from registry.fleet.state import current_generation, issued_digest, issued_state
from registry.models import Drill, Worker, WorkerAck
from serving.state_signing import model_digests

pytestmark = pytest.mark.django_db

PARTLY = "applied but for other (keeps the routes it served before): other v2: sha256 mismatch"


def worker(worker_id: str, host: str, pid: int, failed: int = 0) -> Worker:
    """A live worker serving ``digits``' current generation, ``failed`` 5xx counted so far."""
    generation = current_generation()
    report = {"worker": {"id": worker_id, "host": host, "pid": pid}, "generation": generation, "digest": issued_digest(generation),
              "requests_failed_total": failed}
    return Worker.objects.create(worker_id=worker_id, host=host, pid=pid, url=f"http://{host}:8000", generation=generation,
                                 last_report=report, last_seen_at=timezone.now())


def follows(worker_id: str, *, failed: int = 0, pid: int | None = None, ack_error: str = "", model_digest_only: bool = False):
    """What ``worker_id`` does once the rollback is made: acks it, then reports serving it."""
    return {"worker_id": worker_id, "failed": failed, "pid": pid, "ack_error": ack_error, "model_digest_only": model_digest_only}


def answering(*followers: dict):
    """A ``made`` callback for ``run_drill``: at its first call (the rollback committed, the
    drill about to watch), each follower acks the rollback's generation and reports it."""
    calls = []

    def made(change: str) -> None:
        calls.append(change)
        if len(calls) > 1:
            return
        generation = Drill.objects.get(status="running").to_generation
        for follower in followers:
            row = Worker.objects.get(worker_id=follower["worker_id"])
            WorkerAck.objects.create(worker_id=row.worker_id, generation=generation, ok=not follower["ack_error"], error=follower["ack_error"])
            report = {"worker": {"id": row.worker_id, "host": row.host, "pid": follower["pid"] or row.pid}, "generation": generation,
                      "digest": issued_digest(generation), "requests_failed_total": follower["failed"]}
            if follower["model_digest_only"]:  # serves digits as issued, but not the whole state
                report |= {"digest": "f" * 64, "models": {"digits": model_digests(issued_state(generation))["digits"]}}
            row.last_report, row.last_seen_at = report, timezone.now()
            row.save(update_fields=["last_report", "last_seen_at"])

    return made


@pytest.fixture
def passed_drill(canary_digits, operator, settings) -> Drill:
    """Two workers that ack and confirm the rollback; no request failed."""
    settings.DRILL_ACK_TIMEOUT_S = 2
    worker("w-fast", "host-a", 101, failed=4)
    worker("w-other", "host-b", 202)
    drill = drills.run_drill(canary_digits, operator, roll_forward=False, made=answering(follows("w-fast", failed=4), follows("w-other")))
    assert drill.status == "passed", drill.error
    return drill


@pytest.fixture
def failed_drill(canary_digits, operator, settings) -> Drill:
    """One worker confirms by digits' own digest (another model fails there), one restarts
    under its id, one never acks; rolled forward, which no worker acks in time. The summary
    runs well past the Drills table's 140 characters."""
    settings.DRILL_ACK_TIMEOUT_S = 0.3
    worker("w-partly", "host-a", 101)
    worker("w-restarted", "host-b", 202, failed=7)
    worker("w-mute", "host-c", 303)
    drill = drills.run_drill(canary_digits, operator, roll_forward=True, made=answering(
        follows("w-partly", ack_error=PARTLY, model_digest_only=True), follows("w-restarted", pid=203, failed=0)))
    assert drill.status == "failed"
    return drill


def row_of(page: str, worker_id: str) -> str:
    start = page.index(f'<tr data-worker="{worker_id}"')
    return page[start:page.index("</tr>", start)]


def seconds(value: float) -> str:
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def test_a_passed_drill_shows_each_workers_ack_and_confirmation_and_its_matching_digest(viewer_page, passed_drill):
    page = viewer_page.get(f"/drills/{passed_drill.pk}/").content.decode()

    for entry, host in zip(passed_drill.workers, ("host-a", "host-b"), strict=True):
        row = row_of(page, entry["worker"])
        assert f'<td data-label="Host">{host}</td>' in row
        assert f'<td class="num" data-label="Ack">{seconds(entry["ack_s"])}</td>' in row
        assert f'<td class="num" data-label="Confirmed">{seconds(entry["confirmed_s"])}</td>' in row
        assert f'<code title="{passed_drill.to_digest}">{passed_drill.to_digest[:12]}…</code>' in row
        assert "✓ matches the rollback&#x27;s digest" in row and 'data-match="yes"' in row
        assert '<td class="num" data-label="Failed req.">0</td>' in row
    assert '<span class="badge badge-passed">Passed</span>' in page
    assert f"{passed_drill.from_generation} → {passed_drill.to_generation}" in page
    assert f'<code class="digest-full">{passed_drill.to_digest}</code>' in page  # the full digest, as text
    assert "by olivia" in page and "not asked" in page


def test_a_failed_drill_shows_each_workers_fate_and_its_whole_summary(viewer_page, failed_drill):
    rows = {entry["worker"]: entry for entry in failed_drill.workers}
    assert len(failed_drill.error) > 140  # the Drills table cuts it there

    page = viewer_page.get(f"/drills/{failed_drill.pk}/").content.decode()

    assert html_module.escape(failed_drill.error) in page
    partly = row_of(page, "w-partly")
    assert f'<td class="num" data-label="Confirmed">{seconds(rows["w-partly"]["confirmed_s"])}</td>' in partly
    assert "≠ differs from the rollback&#x27;s digest: confirmed by the digest of digits alone" in partly and 'data-match="no"' in partly
    assert "it said it failed to apply" in partly and f"followed, but not the whole state: {PARTLY}" in partly
    restarted = row_of(page, "w-restarted")
    assert "restarted during the drill: pid 202 → 203" in restarted
    assert '<td class="num" data-label="Failed req.">unknown</td>' in restarted
    mute = row_of(page, "w-mute")
    assert '<span class="error-text">no ack</span>' in mute and '<span class="error-text">not confirmed</span>' in mute
    assert '<li class="error-text">no ack before the timeout</li>' in mute and 'data-match="none"' in mute
    missed = ", ".join(failed_drill.forward_unconfirmed)  # its roll forward no worker acked in time
    assert failed_drill.forward_unconfirmed and (f"<dt>Roll forward</dt><dd>to generation {failed_drill.forward_generation}<span class=\"hint error-text\">"
                                                 f"not followed by {missed} when the drill ended") in page


def test_a_running_drill_says_so(viewer_page, canary_digits, operator):
    drill = Drill.objects.create(model=canary_digits, actor=operator, started_at=timezone.now(), target_s=10, roll_forward=True,
                                 from_generation=2, to_generation=3, forward_pending=True)

    page = viewer_page.get(f"/drills/{drill.pk}/").content.decode()

    assert "This drill is running" in page and 'data-settled="false"' in page
    assert "No worker rows yet" in page


def test_a_workers_entry_with_unexpected_or_missing_keys_still_renders(viewer_page, canary_digits, operator):
    started = timezone.now()
    drill = Drill.objects.create(model=canary_digits, actor=None, status="failed", started_at=started, finished_at=started + timedelta(seconds=1),
                                 target_s=10, from_generation=2, to_generation=3, to_digest="a" * 64, error="1 of 1 workers never confirmed",
                                 workers=[{"worker": "w-new", "ack_s": "soon", "queue_depth": {"p99": 3}, "digest": 12345, "generation": "7",
                                           "failed_requests": "lots"}, {}, "not a row"])

    response = viewer_page.get(f"/drills/{drill.pk}/")

    page = response.content.decode()
    assert response.status_code == 200
    new = row_of(page, "w-new")
    assert '<li class="hint">ack_s: soon</li>' in new and '<li class="hint">queue_depth: {&quot;p99&quot;: 3}</li>' in new
    for shown in ("digest: 12345", "generation: 7", "failed_requests: lots"):  # of the wrong type: shown as written, not dropped
        assert f'<li class="hint">{shown}</li>' in new
    assert '<li class="error-text">never acked</li>' in new
    assert "an entry this page cannot read: not a row" in page
    assert page.count('<tr data-worker="?"') == 2 and "by system" in page


def test_an_unknown_drill_is_404(viewer_page, passed_drill):
    assert viewer_page.get(f"/drills/{passed_drill.pk + 1}/").status_code == 404


def test_a_stranger_is_sent_to_sign_in(client, passed_drill):
    response = client.get(f"/drills/{passed_drill.pk}/")

    assert response.status_code == 302 and response["Location"] == f"/login/?next=/drills/{passed_drill.pk}/"


def test_the_drill_fragment_is_the_same_section_alone(viewer_page, passed_drill):
    fragment = viewer_page.get(f"/drills/{passed_drill.pk}/?fragment=drill").content.decode()

    assert fragment.lstrip().startswith("<section") and 'data-settled="true"' in fragment and "<html" not in fragment


def test_the_drills_table_links_each_drill_and_ends_a_cut_summary_with_a_link(viewer_page, failed_drill):
    page = viewer_page.get("/drills/").content.decode()

    assert f'<a href="/drills/{failed_drill.pk}/">#{failed_drill.pk}</a>' in page
    assert f'…</span> <a href="/drills/{failed_drill.pk}/">full summary of drill #{failed_drill.pk}</a>' in page
    assert html_module.escape(failed_drill.error) not in page.replace(f'title="{html_module.escape(failed_drill.error)}"', "")


def test_the_model_pages_last_drill_links_its_per_worker_timings(viewer_page, passed_drill):
    page = viewer_page.get("/models/digits/").content.decode()

    assert f'<a href="/drills/{passed_drill.pk}/">per-worker timings</a>' in page
    assert f'<a href="/drills/{passed_drill.pk}/">#{passed_drill.pk}</a>' in page  # the recent drills table too


def test_a_digest_other_than_the_rollbacks_is_flagged_unless_the_drill_said_why_it_counts(viewer_page, canary_digits, operator):
    started = timezone.now()
    drill = Drill.objects.create(model=canary_digits, actor=operator, status="failed", started_at=started, finished_at=started + timedelta(seconds=1),
                                 target_s=10, from_generation=2, to_generation=3, to_digest="a" * 64, error="1 of 2 workers never confirmed",
                                 workers=[{"worker": "w-later", "ack_s": 0.2, "ok": True, "confirmed_s": 0.5, "generation": 4, "digest": "c" * 64},
                                          {"worker": "w-odd", "ack_s": 0.2, "ok": True, "confirmed_s": None, "generation": 3, "digest": "b" * 64}])

    page = viewer_page.get(f"/drills/{drill.pk}/").content.decode()

    assert "≠ differs from the rollback&#x27;s digest: it served generation 4, a later state that kept the rollback" in row_of(page, "w-later")
    assert '<span class="error-text">✗ differs from the rollback&#x27;s digest</span>' in row_of(page, "w-odd")
