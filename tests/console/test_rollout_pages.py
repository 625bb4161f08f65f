"""The rollout panel of the model page and its forms: start a rollout with a plan, watch
its steps and last verdict, pause, resume and abort it; viewers read and change nothing.
Verdicts are made as the Celery beat makes them (``rollouts.tick`` over stored samples)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.utils import timezone

from registry.actions import releases, rollouts
from registry.domain.choices import RolloutStatus
from registry.models import AuditEvent, Release, Rollout
from tests.console.conftest import (
    add_version,
    figures,
    incompatible_v3,
    judge_window,
    start_rollout,
)

pytestmark = pytest.mark.django_db

START = "/models/digits/rollouts/"
STANDARD = {"canary_version": "2", "plan": "standard", "expected_generation": "1"}


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def panel(client) -> str:
    return client.get("/models/digits/?fragment=rollout-panel").content.decode()


def snapshot() -> tuple:
    return (list(Release.objects.values_list("generation", "routes")), list(Rollout.objects.values_list("pk", "status", "step_index")),
            AuditEvent.objects.count())


# ---- no rollout yet ----------------------------------------------------------------------


def test_without_a_rollout_an_operator_gets_the_start_form_with_its_plans(operator_page, digits):
    html = panel(operator_page)

    assert 'action="/models/digits/rollouts/"' in html
    assert '<option value="2" selected>v2</option>' in html
    assert "Standard: 1 → 10 → 50 → 100, 5 min per step" in html
    assert "Quick: 10 → 50 → 100, 1 min per step" in html
    assert 'name="steps"' in html and 'name="step_minutes"' in html
    assert 'name="force"' not in html  # every candidate takes the stable version's requests
    assert "2 failing windows in a row send everything back to v1" in html


def test_without_a_rollout_a_viewer_reads_that_there_is_none(viewer_page, digits):
    html = panel(viewer_page)

    assert "No rollout yet." in html
    assert 'action="/models/digits/rollouts/"' not in html


# ---- starting --------------------------------------------------------------------------------


def test_starting_the_standard_plan_sends_the_canary_its_first_step(operator_page, digits):
    response = operator_page.post(START, STANDARD)

    rollout = Rollout.objects.get()
    assert response.status_code == 302 and response["Location"] == "/models/digits/"
    assert messages_of(response) == [f"Rollout #{rollout.pk} started: v2 at 1% (step 1 of 4); the analysis judges it every 60 s."]
    assert (rollout.steps, rollout.step_duration_s, rollout.actor.username) == ([1, 10, 50, 100], 300, "olivia")
    assert digits.current_release().routes == [{"version": 1, "weight": 99}, {"version": 2, "weight": 1}]


@pytest.mark.parametrize(("plan", "steps", "step_duration_s"), [
    ({"plan": "quick"}, [10, 50, 100], 60),
    ({"plan": "custom", "steps": "5, 25, 100", "step_minutes": "2"}, [5, 25, 100], 120),
    ({"plan": "custom", "steps": "5 → 25 → 100", "step_minutes": "0.5"}, [5, 25, 100], 30),
    ({"plan": "custom", "steps": "10%, 50 %, 100%", "step_minutes": "1"}, [10, 50, 100], 60),  # was refused as no percentages
])
def test_a_rollout_follows_the_plan_chosen(operator_page, digits, plan, steps, step_duration_s):
    operator_page.post(START, {**STANDARD, **plan})

    rollout = Rollout.objects.get()
    assert (rollout.steps, rollout.step_duration_s) == (steps, step_duration_s)


@pytest.mark.parametrize(("plan", "message"), [
    ({"plan": "custom", "steps": "5, 2, 100", "step_minutes": "1"}, "Rollout not started: steps must increase strictly, got [5, 2, 100]"),
    ({"plan": "custom", "steps": "5, 50", "step_minutes": "1"}, "Rollout not started: the last step must be 100 (it promotes the canary), got 50"),
    ({"plan": "custom", "steps": "five, 100", "step_minutes": "1"},
     "Rollout not started: Custom steps (%): write whole percentages separated by commas, e.g. 1, 10, 50, 100"),
    ({"plan": "custom", "steps": "50, ²", "step_minutes": "1"},  # a digit to str.isdigit, not to int()
     "Rollout not started: Custom steps (%): write whole percentages separated by commas, e.g. 1, 10, 50, 100"),
    ({"plan": "custom", "steps": "5, 100"}, "Rollout not started: a custom plan needs its steps (e.g. 5, 25, 100) and minutes per step"),
    # "30s" meant seconds: the number field dropped the "s" and the rollout ran 30 minutes a step.
    ({"plan": "custom", "steps": "5, 100", "step_minutes": "30s"}, "Rollout not started: Custom minutes per step: Enter a number."),
])
def test_a_bad_plan_is_refused_with_the_reason_and_starts_nothing(operator_page, digits, plan, message):
    before = snapshot()

    response = operator_page.post(START, {**STANDARD, **plan}, HTTP_ACCEPT="application/json")

    assert response.status_code == 400
    assert response.json()["message"] == message
    assert snapshot() == before


def test_a_rollout_from_a_stale_page_is_refused(operator_page, canary_digits):
    before = snapshot()

    response = operator_page.post(START, STANDARD)  # the page showed generation 1; canary_digits is at 2

    assert messages_of(response)[0].startswith("Rollout not started: generation 2 (traffic split changed by olivia at ")
    assert snapshot() == before


def test_a_second_rollout_is_refused_while_one_is_active(operator_page, digits, operator):
    first = start_rollout(digits, operator)
    add_version(digits, 3)

    response = operator_page.post(START, {**STANDARD, "canary_version": "3", "expected_generation": str(digits.current_release().generation)})

    assert messages_of(response) == [f"Rollout not started: rollout #{first.pk} of digits (v2) is running: one rollout per model at a time; abort it first"]
    assert 'action="/models/digits/rollouts/"' not in panel(operator_page)


# ---- force -----------------------------------------------------------------------------------


def test_an_incompatible_candidate_gets_the_force_box_naming_its_difference(operator_page, digits):
    incompatible_v3(digits)

    html = panel(operator_page)

    assert '<option value="3" selected data-incompatible="true">v3 (inputs differ from v1)</option>' in html
    assert "v3's inputs differ from v1's (input &#x27;input&#x27; dimension 1: 4 on v1, 8 here)" in html
    assert 'name="force"' in html


def test_an_incompatible_canary_without_force_is_refused_with_the_registrys_reason(operator_page, digits):
    incompatible_v3(digits)
    before = snapshot()

    response = operator_page.post(START, {**STANDARD, "canary_version": "3"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    assert response.json()["message"] == ("Rollout not started: inputs differ from the stable v1's (v3: input 'input' dimension 1: "
                                          "4 on v1, 8 here): clients would be refused: tick Force and say why in the reason to route "
                                          "traffic to it anyway")
    assert snapshot() == before


def test_force_without_a_reason_is_refused_with_a_message(operator_page, digits):
    incompatible_v3(digits)
    before = snapshot()

    response = operator_page.post(START, {**STANDARD, "canary_version": "3", "force": "on", "reason": "  "})

    assert messages_of(response) == ["Rollout not started: force needs a reason: say why traffic goes to a version with incompatible inputs"]
    assert snapshot() == before


def test_force_with_a_reason_starts_the_rollout_and_marks_it_forced(operator_page, digits):
    incompatible_v3(digits)

    operator_page.post(START, {**STANDARD, "canary_version": "3", "force": "on", "reason": "clients move to 8 features today"})

    rollout = Rollout.objects.get()
    assert (rollout.forced, rollout.reason) == (True, "clients move to 8 features today")
    assert 'title="started with force' in panel(operator_page)


# ---- an active rollout -------------------------------------------------------------------------


def test_an_active_rollout_shows_its_steps_with_the_current_one_highlighted(operator_page, digits, operator):
    rollout = start_rollout(digits, operator)

    html = panel(operator_page)

    assert f'data-rollout="{rollout.pk}" data-url="/api/models/digits/rollouts/{rollout.pk}/" data-active="true"' in html
    assert '<span class="badge badge-running" data-field="rollout-status">Running</span>' in html
    assert '<li class="step step-current" aria-current="step"><span class="step-weight">1%</span><span class="step-label">now</span></li>' in html
    assert '<li class="step step-todo"><span class="step-weight">10%</span>' in html
    assert "Now <strong>v2 at 1%</strong>, step 1 of 4; a passing step holds at least 5 min." in html
    assert '<dd data-field="failures">0 of 2' in html
    assert "No window judged yet: the first verdict is due at" in html
    assert 'id="pause-rollout"' in html and 'id="abort-rollout"' in html
    assert 'action="/models/digits/rollouts/"' not in html  # no second rollout while this one runs


def test_the_panels_state_is_what_its_script_reads_from_the_api(operator_page, digits, operator):
    """rollout.js re-renders the panel when the API's answer differs from data-state."""
    rollout = judge_window(start_rollout(digits, operator))
    body = operator_page.get(f"/api/models/digits/rollouts/{rollout.pk}/").json()

    state = ":".join(str(body[field]) for field in ("status", "windows_judged", "current_step", "consecutive_failures", "release_generation"))

    assert f'data-state="{state}"' in panel(operator_page)


def test_the_last_verdict_is_a_table_of_every_signal_with_its_numbers(operator_page, digits, operator):
    rollout = judge_window(start_rollout(digits, operator), canary=figures(2, client_errors=200))

    html = panel(operator_page)

    assert "Window 1 (step 1, 1%," in html and "✗ failed" in html
    assert '<dd data-field="failures">1 of 2' in html
    assert ('<tr data-signal="client_errors" class="signal-fail">\n        <th scope="row">Client errors (4xx)</th>\n'
            '        <td class="num">100%</td>\n        <td class="num">0%</td>\n        <td class="num">+2% over stable</td>') in html
    assert '<tr data-signal="server_errors" class="signal-pass">' in html
    assert '<tr data-signal="latency_p99" class="signal-unjudged">' in html  # a canary that answered nothing has no latency
    assert "client errors 100.0% on canary vs 0.0% on stable (allowed excess 2.0%, p " in html
    assert rollout.status == RolloutStatus.RUNNING


def test_a_window_waiting_for_data_says_so_and_judges_nothing(operator_page, digits, operator):
    judge_window(start_rollout(digits, operator), canary=figures(2, requests=12))

    html = panel(operator_page)

    assert '<span class="badge badge-waiting_for_data" data-field="rollout-status">Waiting for data</span>' in html
    assert "canary had 12 requests in the window, 100 needed" in html
    assert html.count("not judged</span>") >= 3


# ---- pause, resume, abort ---------------------------------------------------------------------------


def test_pause_stops_the_analysis_and_the_panel_offers_resume(operator_page, digits, operator):
    rollout = start_rollout(digits, operator)

    response = operator_page.post(f"/models/digits/rollouts/{rollout.pk}/pause/", {"reason": "looking at a dashboard"})

    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.PAUSED
    assert messages_of(response) == [f"Rollout #{rollout.pk} paused at step 1 of 4 (v2 at 1%): no window is judged until it is resumed."]
    html = panel(operator_page)
    assert "paused by olivia (looking at a dashboard)" in html
    assert 'id="resume-rollout"' in html and 'id="pause-rollout"' not in html
    assert "Next window</dt><dd>when resumed" in html


def test_a_rollout_paused_by_an_operators_change_shows_the_traffic_in_force_not_its_step(operator_page, digits, operator):
    """After a rollback paused it at step 2, the panel said "Now v2 at 50%" while the
    stable served everything."""
    start_rollout(digits, operator)
    rolled_back = releases.rollback(digits, operator, "the canary looks wrong")

    html = panel(operator_page)

    assert f"Serving <strong>v1 100% (generation {rolled_back.generation})</strong>, which this rollout did not make; " in html
    assert "resuming sets step 1 of 4 again (v2 at 1%)." in html
    assert "Now <strong>" not in html


def test_resume_sets_the_step_again_and_says_so(operator_page, digits, operator):
    rollout = rollouts.pause(start_rollout(digits, operator), operator)

    response = operator_page.post(f"/models/digits/rollouts/{rollout.pk}/resume/", {}, HTTP_ACCEPT="application/json")

    assert response.json() == {"level": "success", "rollout": rollout.pk,
                               "message": f"Rollout #{rollout.pk} resumed: v2 at 1% (step 1 of 4), the step's hold starts over."}
    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.RUNNING


def test_pausing_twice_answers_the_conflict_and_changes_nothing(operator_page, digits, operator):
    rollout = rollouts.pause(start_rollout(digits, operator), operator)
    before = snapshot()

    response = operator_page.post(f"/models/digits/rollouts/{rollout.pk}/pause/", {}, HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    assert response.json()["message"] == f"rollout #{rollout.pk} is paused: only a running rollout can be paused"
    assert snapshot() == before


def test_abort_asks_first_naming_what_traffic_returns_to(operator_page, digits, operator):
    rollout = start_rollout(digits, operator)

    html = operator_page.get(f"/models/digits/rollouts/{rollout.pk}/abort/").content.decode()

    assert f"Abort rollout #{rollout.pk}?" in html
    assert "returns to <strong>v1 100%</strong> at once" in html
    assert f'<form id="abort-rollout-form" method="post" action="/models/digits/rollouts/{rollout.pk}/abort/" class="confirm">' in html


def test_abort_returns_everything_to_stable_and_the_panel_shows_the_outcome(operator_page, digits, operator):
    rollout = start_rollout(digits, operator)

    response = operator_page.post(f"/models/digits/rollouts/{rollout.pk}/abort/", {"reason": "wrong version"})

    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.ABORTED
    assert digits.current_release().routes == [{"version": 1, "weight": 100}]
    generation = digits.current_release().generation
    assert messages_of(response) == [f"Rollout #{rollout.pk} aborted: v1 is back to 100% (generation {generation}). Workers are converging."]
    html = panel(operator_page)
    assert '<p class="rollout-outcome outcome-aborted"><strong>Aborted</strong>' in html
    assert "aborted by olivia (wrong version)" in html
    assert f'<li data-rollout-item="{rollout.pk}">' in html  # the history
    assert 'action="/models/digits/rollouts/"' in html  # a new one may start


def test_after_a_promote_made_since_the_abort_button_and_dialog_say_the_traffic_stays_and_so_does_the_answer(operator_page, digits, operator):
    """They said "v1 back to 100%" and "v1 is back to 100% (generation 2)" while v2 kept
    all the traffic: the abort leaves a promote made since its last step standing."""
    rollout = start_rollout(digits, operator)
    promoted = releases.promote(digits, operator, "taking v2 now")

    html = panel(operator_page)
    response = operator_page.post(f"/models/digits/rollouts/{rollout.pk}/abort/", {"abort_to": "stays"})

    assert "■ Abort: traffic stays as it is" in html and "back to 100%" not in html
    assert "the traffic stays as it is</strong>: generation 3 (v2 100%) was made since the rollout's last step" in html
    assert '<input type="hidden" name="abort_to" value="stays">' in html
    assert messages_of(response) == [f"Rollout #{rollout.pk} aborted; the traffic stays as it was (v2 100%)."]
    assert digits.current_release().generation == promoted.generation


def test_an_abort_whose_dialog_promised_what_it_no_longer_does_is_refused_and_changes_nothing(operator_page, digits, operator):
    rollout = start_rollout(digits, operator)
    assert '<input type="hidden" name="abort_to" value="v1">' in panel(operator_page)
    releases.promote(digits, operator, "taking v2 now")
    before = snapshot()

    response = operator_page.post(f"/models/digits/rollouts/{rollout.pk}/abort/", {"abort_to": "v1"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    assert response.json()["message"] == ("the traffic changed since your page: generation 3 (v2 100%) is in force, and an abort now leaves "
                                          "the traffic as it is, not sends all of it to v1 as shown: nothing changed; reload and decide again")
    assert snapshot() == before


def test_an_abort_dialog_open_across_the_rollouts_own_step_still_aborts(operator_page, digits, operator):
    """Checked by generation, the abort was refused once the rollout had moved a step while
    its dialog was open, though it would do just what the dialog said."""
    rollout = start_rollout(digits, operator, step_duration_s=0)
    judge_window(rollout)  # the next step: a generation the page never showed
    assert Rollout.objects.get(pk=rollout.pk).release_generation > 2

    response = operator_page.post(f"/models/digits/rollouts/{rollout.pk}/abort/", {"abort_to": "v1"})

    assert messages_of(response)[0].startswith(f"Rollout #{rollout.pk} aborted: v1 is back to 100%")
    assert digits.current_release().routes == [{"version": 1, "weight": 100}]


def test_abort_to_stable_from_a_page_older_than_the_traffic_is_refused_while_a_rollout_is_active(operator_page, digits, operator):
    """The release panel's "Abort to v1 100%" took the active rollout's abort, which took
    no generation: a promote made after the page was drawn was answered "v1 is back"."""
    start_rollout(digits, operator)
    seen = digits.current_release().generation
    releases.promote(digits, operator, "taking v2 now")
    before = snapshot()

    response = operator_page.post("/models/digits/to-stable/", {"expected_generation": seen, "promised_version": 1}, HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    assert snapshot() == before


def test_a_resume_from_a_page_older_than_the_traffic_is_refused(operator_page, digits, operator):
    rollout = start_rollout(digits, operator)
    rollouts.pause(rollout, operator)
    seen = digits.current_release().generation
    releases.set_routes(digits, [{"version": 1, "weight": 70}, {"version": 2, "weight": 30}], operator)
    before = snapshot()

    response = operator_page.post(f"/models/digits/rollouts/{rollout.pk}/resume/", {"expected_generation": seen}, HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    assert snapshot() == before


def test_an_abort_that_made_no_release_links_no_generation_as_made_in_the_audit(operator_client, digits, operator):
    rollout = start_rollout(digits, operator)
    releases.promote(digits, operator, "taking v2 now")

    rollouts.abort(Rollout.objects.get(pk=rollout.pk), operator)

    aborted = operator_client.get("/api/models/digits/audit/", {"kind": "rollout"}).json()[0]
    assert "aborted" in aborted["message"]
    assert aborted["generation"] is None


def test_a_promoted_rollout_shows_every_step_done_and_its_outcome(operator_page, digits, operator):
    rollout = start_rollout(digits, operator, steps=(50, 100), step_duration_s=0)
    rollout = judge_window(judge_window(rollout))

    html = panel(operator_page)

    assert rollout.status == RolloutStatus.PROMOTED
    assert html.count('class="step step-done"') == 2
    assert "<strong>Promoted</strong>" in html and "every step passed; v2 promoted at generation" in html


def test_the_history_lists_the_last_rollouts_with_their_status(operator_page, digits, operator):
    first = rollouts.abort(start_rollout(digits, operator), operator, "first try")
    second = start_rollout(digits, operator)

    html = panel(operator_page)

    assert html.index(f'data-rollout-item="{second.pk}"') < html.index(f'data-rollout-item="{first.pk}"')
    assert '<span class="badge badge-aborted">Aborted</span>' in html


# ---- viewers -----------------------------------------------------------------------------------------


def test_a_viewer_sees_an_active_rollout_without_any_control(viewer_page, digits, operator):
    rollout = judge_window(start_rollout(digits, operator))

    html = panel(viewer_page)

    assert '<span class="badge badge-running" data-field="rollout-status">Running</span>' in html
    assert '<table class="table signals" id="signals">' in html
    for control in ("/pause/", "/resume/", "/abort/", 'action="/models/digits/rollouts/"', "<form"):
        assert control not in html
    assert viewer_page.get(f"/models/digits/rollouts/{rollout.pk}/").status_code == 200


@pytest.mark.parametrize("action", ["pause", "resume", "abort"])
def test_a_viewers_rollout_post_is_refused_and_nothing_changes(viewer_page, digits, operator, action):
    rollout = start_rollout(digits, operator)
    before = snapshot()

    response = viewer_page.post(f"/models/digits/rollouts/{rollout.pk}/{action}/", {})

    assert response.status_code == 403
    assert snapshot() == before


def test_a_viewers_start_is_refused_and_starts_nothing(viewer_page, digits):
    before = snapshot()

    assert viewer_page.post(START, STANDARD).status_code == 403
    assert snapshot() == before


# ---- a rollout's own page ------------------------------------------------------------------------------


def test_a_rollouts_page_lists_every_window_judged(viewer_page, digits, operator):
    rollout = start_rollout(digits, operator)
    judge_window(rollout)
    judge_window(rollout, canary=figures(2, errors=100))

    html = viewer_page.get(f"/models/digits/rollouts/{rollout.pk}/").content.decode()

    assert f"digits rollout #{rollout.pk}" in html
    assert 'data-window="2"' in html and 'data-window="1"' in html
    assert "✗ failed" in html and "✓ passed" in html
    assert 'id="rollout-charts"' in html and "js/rollout.js" in html


def test_an_unknown_rollout_is_a_404(viewer_page, digits):
    assert viewer_page.get("/models/digits/rollouts/999/").status_code == 404


def test_the_drill_dialog_warns_that_a_drill_pauses_the_running_rollout(operator_page, digits, operator):
    rollout = start_rollout(digits, operator)

    html = operator_page.get("/models/digits/").content.decode()

    assert (f"Rollout #{rollout.pk} is running: the drill's rollback is a manual traffic change, so it pauses the rollout, "
            "which stays paused after the roll forward until you resume it.") in html


def test_the_panel_says_when_the_analysis_has_stopped_judging(viewer_page, digits, operator, settings):
    settings.ROLLOUT_TICK_S = 5
    rollout = start_rollout(digits, operator)
    due = timezone.now() - timedelta(seconds=90)
    Rollout.objects.filter(pk=rollout.pk).update(next_window_at=due)

    html = panel(viewer_page)
    late_by_now_s = (timezone.now() - due).total_seconds()

    # The page counts from its render, which a loaded CI box may reach a second later ("91 s" is as true then):
    # 90 s, and at most the time the test has taken since, rounded as the page rounds.
    said = re.search(r"The analysis is (\d+) s late", html)
    assert said and 90 <= int(said[1]) <= late_by_now_s + 0.5, (said and said[0], late_by_now_s)
    assert "Are the Celery worker that runs beat (<code>registry.tasks.analyse_rollouts</code>) and its broker (Redis) up?" in html


def test_the_panel_says_nothing_late_while_the_analysis_is_on_time(viewer_page, digits, operator):
    start_rollout(digits, operator)

    assert 'id="analysis-overdue"' not in panel(viewer_page)


@pytest.mark.parametrize("shown", ["v0", "stays; v1", "v1\u0000", "V1", "v" + "9" * 12])
def test_an_abort_with_a_promise_no_dialog_renders_is_a_400_and_changes_nothing(operator_page, digits, operator, shown):
    rollout = start_rollout(digits, operator)
    before = snapshot()

    response = operator_page.post(f"/models/digits/rollouts/{rollout.pk}/abort/", {"abort_to": shown}, HTTP_ACCEPT="application/json")

    assert response.status_code == 400
    assert "abort_to" in response.json()["message"]  # named, with what it takes or what it holds that it may not
    assert snapshot() == before
