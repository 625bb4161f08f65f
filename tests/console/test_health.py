"""The health badge: "Healthy" only with traffic and every signal within its threshold
(the running rollout's last verdict, else the last minute's 5xx and 4xx shares against
the canary analysis' defaults); no traffic is "Idle"; a canary refusing its requests is
named, never "Healthy · 0% errors"; a worker gone silent within the hour the Workers
page lists it is named, never "Healthy" beside the live workers' convergence."""

from __future__ import annotations

import pytest

from registry.fleet.state import issued_state
from serving.state_signing import model_digests
from tests.console.conftest import (
    figures,
    judge_window,
    live_worker,
    read_silence_as_made,
    report_from,
    served,
    start_rollout,
)

pytestmark = pytest.mark.django_db


def health_pill(client) -> str:
    html = read_silence_as_made(client.get("/").content.decode(), GONE_SILENT_S)
    start = html.index('data-field="health">') + len('data-field="health">')
    return html[start:html.index("</span>", start)]


def pill_class(client) -> str:
    html = client.get("/").content.decode()
    end = html.index('" data-field="health">')
    return html[html.rindex("pill-", 0, end):end]


def test_a_model_with_live_workers_and_no_requests_is_idle_not_healthy(viewer_page, canary_digits):
    live_worker(canary_digits)

    assert health_pill(viewer_page) == "Idle: no requests in the last 1 min"
    assert pill_class(viewer_page) == "pill-idle"


def test_a_model_answering_within_the_thresholds_is_healthy(viewer_page, canary_digits):
    live_worker(canary_digits)
    served(canary_digits, 1, 900, errors=1, client_errors=5)
    served(canary_digits, 2, 100, errors=1, client_errors=2)

    assert health_pill(viewer_page) == "Healthy"
    assert pill_class(viewer_page) == "pill-ok"


def test_a_model_served_as_issued_is_healthy_while_another_model_fails_on_the_worker(viewer_page, canary_digits):
    """Every model read "bad: 1 of 1 workers failed to apply" for one model's broken canary."""
    worker = live_worker(canary_digits)
    generation = canary_digits.current_release().generation
    digits = model_digests(issued_state(generation))["digits"]
    worker.last_report = {**worker.last_report, "digest": "e" * 64, "models": {"digits": digits, "other": "f" * 64}}
    worker.ok, worker.error = False, "applied but for other (keeps the routes it served before): other v2: sha256 mismatch"
    worker.save()
    served(canary_digits, 1, 900)
    served(canary_digits, 2, 100)

    assert health_pill(viewer_page) == "Healthy"


def test_a_model_failing_on_the_worker_itself_is_bad(viewer_page, canary_digits):
    worker = live_worker(canary_digits)
    worker.last_report = {**worker.last_report, "digest": "e" * 64, "models": {"digits": "f" * 64}}
    worker.ok, worker.error = False, "applied but for digits (keeps the routes it served before): digits v2: sha256 mismatch"
    worker.save()
    served(canary_digits, 1, 900)

    assert health_pill(viewer_page).startswith("1 of 1 workers applied but for digits (keeps the routes it served before): digits v2:")


def test_a_canary_answering_400_to_everything_is_named_by_its_client_errors(viewer_page, canary_digits):
    live_worker(canary_digits, versions=[{"model": "digits", "version": 2, "requests": 10, "requests_per_s": 10.0, "errors": 0, "client_errors": 10}])
    served(canary_digits, 1, 900)
    served(canary_digits, 2, 100, client_errors=100)

    html = viewer_page.get("/").content.decode()

    assert health_pill(viewer_page) == "Client errors 100% on v2 (canary)"
    assert pill_class(viewer_page) == "pill-bad"
    assert "Healthy" not in html
    assert '<td class="num" data-field="client_error_rate">100%</td>' in html  # beside the 5xx column


def test_server_errors_over_the_limit_are_named(viewer_page, canary_digits):
    live_worker(canary_digits)
    served(canary_digits, 1, 900)
    served(canary_digits, 2, 100, errors=7)

    assert health_pill(viewer_page) == "Server errors 7% on v2 (canary)"


def test_a_canary_is_judged_by_its_excess_over_the_stables_share(viewer_page, canary_digits):
    """The thresholds are excesses: 4xx that both versions answer are the clients' own."""
    live_worker(canary_digits)
    served(canary_digits, 1, 900, client_errors=45)  # 5%: over the 2% limit on its own
    served(canary_digits, 2, 100, client_errors=6)  # 6%: 1 point over the stable's

    assert health_pill(viewer_page) == "Client errors 5% on v1 (stable)"


def test_a_running_rollouts_failing_verdict_names_the_signal(viewer_page, digits, operator):
    rollout = judge_window(start_rollout(digits, operator), canary=figures(2, client_errors=200))
    live_worker(digits)
    served(digits, 1, 990)
    served(digits, 2, 10)  # the last minute looks fine: the verdict is what failed

    assert health_pill(viewer_page) == f"Client errors 100% on canary v{rollout.canary_version} (stable 0%)"
    assert pill_class(viewer_page) == "pill-bad"


def test_the_model_page_shows_the_same_health(viewer_page, canary_digits):
    live_worker(canary_digits)
    served(canary_digits, 2, 100, client_errors=100)

    html = viewer_page.get("/models/digits/?fragment=health").content.decode()

    assert '<span class="pill pill-bad model-health" id="model-health"' in html and "Client errors 100% on v2 (canary)" in html


# ---------------------------------------------------------------- gone workers


GONE_SILENT_S = 7


def healthy_with_a_gone_worker(model, *, silent_s: float = GONE_SILENT_S):
    """``model`` served within the thresholds by one live worker, beside ``w-gone``: it
    served the same generation and has been silent for ``silent_s`` (past WORKER_GONE_AFTER_S)."""
    live_worker(model)
    served(model, 1, 900)
    served(model, 2, 100)
    return report_from("w-gone", generation=model.current_release().generation, versions=[], seconds_ago=silent_s)


def test_a_worker_gone_silent_is_named_and_the_live_workers_convergence_stays(viewer_page, canary_digits):
    # convergence() counts live workers only: with a third worker frozen for 7 s the page said "Healthy ✓ 2/2 converged".
    healthy_with_a_gone_worker(canary_digits)

    assert health_pill(viewer_page) == "1 worker gone (silent 7 s)"
    assert pill_class(viewer_page) == "pill-warn"
    assert "✓ 1/1 converged" in viewer_page.get("/").content.decode()


def test_the_model_page_names_a_gone_worker_too(viewer_page, canary_digits):
    healthy_with_a_gone_worker(canary_digits)

    html = read_silence_as_made(viewer_page.get("/models/digits/?fragment=health").content.decode(), GONE_SILENT_S)

    assert '<span class="pill pill-warn model-health" id="model-health"' in html and "1 worker gone (silent 7 s)" in html


def test_several_gone_workers_are_counted_with_the_span_of_their_silences(viewer_page, canary_digits):
    healthy_with_a_gone_worker(canary_digits)
    report_from("w-gone-earlier", generation=canary_digits.current_release().generation, versions=[], seconds_ago=200)

    assert health_pill(viewer_page) == "2 workers gone (silent 7 s to 3 min)"


def test_a_worker_whose_last_report_said_it_stopped_is_not_counted_gone(viewer_page, canary_digits):
    healthy_with_a_gone_worker(canary_digits)
    stopped = report_from("w-stopped", generation=canary_digits.current_release().generation, versions=[], seconds_ago=7)
    stopped.last_report = {**stopped.last_report, "state": "stopped"}
    stopped.save()

    assert health_pill(viewer_page) == "1 worker gone (silent 7 s)"


def test_a_worker_gone_longer_than_the_workers_page_lists_it_is_not_counted(viewer_page, canary_digits):
    healthy_with_a_gone_worker(canary_digits)
    report_from("w-gone-yesterday", generation=canary_digits.current_release().generation, versions=[], seconds_ago=2 * 3600)

    assert health_pill(viewer_page) == "1 worker gone (silent 7 s)"


def test_the_rollback_target_is_said_warm_on_every_live_worker_not_every_worker(viewer_page, canary_digits):
    # Only live workers' reports are read: "warm on every worker" was shown beside a frozen one.
    live_worker(canary_digits, versions=[{"model": "digits", "version": 1}, {"model": "digits", "version": 2}])
    report_from("w-gone", generation=canary_digits.current_release().generation, versions=[], seconds_ago=GONE_SILENT_S)

    html = viewer_page.get("/models/digits/").content.decode()

    assert "Rollback target warm on every live worker." in html
