"""What the traffic controls say before they act and what the timeline says after: the
abort-to-stable button, the 100% confirmation, what a rollback or a promote returns to,
drills rolling forward by default, the release in force at each audit event, and 4xx
beside 5xx in every live table."""

from __future__ import annotations

from html import escape

import pytest
from django.contrib.messages import get_messages

from registry.actions import events, releases, rollouts
from registry.domain.choices import RolloutStatus
from registry.models import AuditEvent, Release
from tests.console.conftest import incompatible_v3, report_from, served, start_rollout
from tests.fixtures.evaluations import evaluated_on_holdout

pytestmark = pytest.mark.django_db

SPLIT = "/models/digits/split/"
TO_STABLE = "/models/digits/to-stable/"


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def releases_made() -> list:
    return list(Release.objects.values_list("generation", "routes"))


def release_panel(client) -> str:
    return client.get("/models/digits/?fragment=release-panel").content.decode()


def test_a_small_shadow_is_shown_by_its_share_not_as_zero(operator_page, digits, operator):
    releases.set_routes(digits, [{"version": 1, "weight": 100}, {"version": 2, "weight": 0, "shadow": 0.0049}], operator)

    assert "v2 mirrors 0.49% of requests as a shadow" in release_panel(operator_page)


# ---- abort to stable -------------------------------------------------------------------------


def test_a_weighted_canary_gets_an_abort_button_beside_rollback(operator_page, canary_digits):
    html = release_panel(operator_page)

    assert 'id="rollback-button"' in html
    assert '<a class="button danger-outline big" id="to-stable-button" href="/models/digits/to-stable/" data-dialog="to-stable-dialog">■ Abort to v1 100%</a>' in html


def test_without_a_canary_there_is_nothing_to_abort(operator_page, canary_digits, operator):
    releases.rollback(canary_digits, operator)

    assert 'id="to-stable-button"' not in release_panel(operator_page)


def test_the_abort_confirmation_names_what_traffic_returns_to(operator_page, canary_digits):
    html = operator_page.get(TO_STABLE).content.decode()

    assert "Send everything back to v1?" in html
    assert "Traffic returns to <strong>v1 100%</strong>, the stable version, at once." in html
    assert "Now: v1 90%, v2 10% (generation 2)." in html


def test_abort_to_stable_sends_everything_to_the_stable_version(operator_page, canary_digits):
    response = operator_page.post(TO_STABLE, {"reason": "canary answers 400", "expected_generation": "2"})

    release = canary_digits.current_release()
    assert (release.routes, release.reason) == ([{"version": 1, "weight": 100}], "canary answers 400")
    assert messages_of(response) == ["Generation 3: traffic is now v1 100%. Workers are converging."]


def test_a_double_clicked_abort_to_stable_changes_traffic_once(operator_page, canary_digits):
    operator_page.post(TO_STABLE, {"expected_generation": "2"})
    after_first = releases_made()

    response = operator_page.post(TO_STABLE, {"expected_generation": "2"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    assert "replaced generation 2 you saw: nothing changed" in response.json()["message"]
    assert releases_made() == after_first


def test_abort_to_stable_with_no_canary_taking_traffic_is_a_409_and_makes_no_generation(operator_page, digits):
    """It made a rollback release routing what was already routed, which moved the rollback point."""
    generation = digits.current_release().generation
    before = releases_made()

    response = operator_page.post(TO_STABLE, {"expected_generation": str(generation)}, HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    message = f"digits already serves v1 100% (generation {generation}): no canary takes traffic, nothing to change"
    assert response.json()["message"] == message
    assert releases_made() == before


def test_abort_to_stable_during_a_rollout_aborts_the_rollout(operator_page, digits, operator):
    rollout = start_rollout(digits, operator)

    html = operator_page.get(TO_STABLE).content.decode()
    response = operator_page.post(TO_STABLE, {"reason": "p99", "expected_generation": str(digits.current_release().generation)})

    rollout.refresh_from_db()
    assert f"and rollout #{rollout.pk} (v2, running) ends as aborted" in html
    assert rollout.status == RolloutStatus.ABORTED
    assert digits.current_release().routes == [{"version": 1, "weight": 100}]
    assert messages_of(response)[0].startswith(f"Rollout #{rollout.pk} aborted: v1 is back to 100%")


def test_a_viewer_cannot_abort_to_stable(viewer_page, canary_digits):
    before = releases_made()

    assert viewer_page.get(TO_STABLE).status_code == 403
    assert viewer_page.post(TO_STABLE, {"expected_generation": "2"}).status_code == 403
    assert releases_made() == before


# ---- 100% asks first -----------------------------------------------------------------------------


def test_the_100_percent_preset_has_a_confirmation_like_promote(operator_page, canary_digits):
    html = release_panel(operator_page)

    assert '<dialog id="full-share-dialog" aria-labelledby="confirm-full-share-title">' in html
    assert '<button type="submit" class="button primary" name="confirmed_weight" value="100" id="confirm-full-share">Send 100%</button>' in html


@pytest.mark.parametrize("body", [{"preset": "100"}, {"weight": "100"}])
def test_an_unconfirmed_100_percent_asks_first_and_changes_nothing(operator_page, canary_digits, body):
    before = releases_made()

    response = operator_page.post(SPLIT, {"canary_version": "2", "expected_generation": "2", **body})

    html = response.content.decode()
    assert response.status_code == 200
    assert "Send 100% to <span data-full-version>v2</span>?" in html
    assert "becomes the stable version and takes <strong>100%</strong> of the traffic of digits" in html
    assert '<input type="hidden" name="canary_version" value="2">' in html
    assert releases_made() == before


def test_an_unconfirmed_100_percent_from_the_script_is_refused(operator_page, canary_digits):
    before = releases_made()

    response = operator_page.post(SPLIT, {"canary_version": "2", "preset": "100", "expected_generation": "2"}, HTTP_ACCEPT="application/json")

    assert response.status_code == 400
    assert response.json()["message"] == "v2 at 100% takes all the traffic of digits: confirm it with the 100% button's dialog"
    assert releases_made() == before


# Past 4300 digits Python's int() raises ValueError (its limit on integer strings): the
# share's "at most 100" read one before Django's field could, and the post was a 500.
THOUSANDS_OF_DIGITS = ["1" * 5000, "0" * 5000 + "700"]


@pytest.mark.parametrize("typed", ["0,5", "0.5", "5 5", "1e1", "ten", "101", "250 %", "-1", *THOUSANDS_OF_DIGITS])
def test_a_typed_share_that_is_no_whole_percentage_is_refused_naming_it_and_changes_nothing(operator_page, canary_digits, typed):
    """The number field dropped what it could not read: "0,5" (meant 0.5 %) became 05 and
    5 % was applied (a tired operator, 7 Dec). The field is text now; the server says no."""
    before = releases_made()

    response = operator_page.post(SPLIT, {"canary_version": "2", "weight": typed, "apply": "exact", "expected_generation": "2"},
                                  HTTP_ACCEPT="application/json")

    assert response.status_code == 400
    assert response.json()["message"] == f"Canary share (%): Enter a whole number from 0 to 100, e.g. 10 (got {typed[:20]!r})."
    assert releases_made() == before


@pytest.mark.parametrize("typed", ["20%", " 20 % ", "20"])
def test_a_typed_share_may_carry_its_percent_sign(operator_page, canary_digits, typed):
    operator_page.post(SPLIT, {"canary_version": "2", "weight": typed, "apply": "exact", "expected_generation": "2"})

    assert canary_digits.current_release().routes == [{"version": 1, "weight": 80}, {"version": 2, "weight": 20}]


def test_the_share_field_is_empty_showing_the_current_share_so_typing_replaces_it(operator_page, canary_digits):
    # Pre-filled with the canary's 1, a click and "5" made 15 and applied it.
    html = release_panel(operator_page)

    assert '<input type="text" name="weight" id="id_weight" inputmode="numeric" autocomplete="off" value="" placeholder="now 10">' in html


def test_a_confirmed_100_percent_makes_the_canary_the_only_route(operator_page, canary_digits):
    operator_page.post(SPLIT, {"canary_version": "2", "confirmed_weight": "100", "expected_generation": "2"})

    assert canary_digits.current_release().routes == [{"version": 2, "weight": 100}]


# ---- a version evaluated worse than the stable one is said so before it takes everything ---------------

WORSE = escape("v2 was evaluated worse than the stable v1: accuracy 11.0% on holdout, against v1's accuracy 89.0%.")


def test_promote_says_when_the_canary_was_evaluated_worse_than_the_stable_version(operator_page, canary_digits):
    # A version at 11 % accuracy (stable 89 %) was sent to all the traffic without a word.
    evaluated_on_holdout(canary_digits, {1: 0.89, 2: 0.11})

    assert f'<p class="warn-text" id="promote-evaluation-warning">{WORSE}</p>' in operator_page.get("/models/digits/promote/").content.decode()
    assert f'id="promote-evaluation-warning">{WORSE}</p>' in release_panel(operator_page)


def test_the_100_percent_confirmation_says_when_the_version_was_evaluated_worse(operator_page, canary_digits):
    evaluated_on_holdout(canary_digits, {1: 0.89, 2: 0.11})

    asked = operator_page.post(SPLIT, {"canary_version": "2", "preset": "100", "expected_generation": "2"}).content.decode()

    assert f'<p class="warn-text" data-worse-for="2">{WORSE}</p>' in asked
    assert f'<p class="warn-text" data-worse-for="2">{WORSE}</p>' in release_panel(operator_page)  # the dialog's line for the chosen version


def test_the_version_lists_of_the_split_and_rollout_forms_mark_a_version_evaluated_worse(operator_page, canary_digits):
    evaluated_on_holdout(canary_digits, {1: 0.89, 2: 0.11})

    split = release_panel(operator_page)
    rollout = operator_page.get("/models/digits/?fragment=rollout-panel").content.decode()

    assert '<option value="2" selected>v2 (evaluated worse than v1)</option>' in split
    assert '<option value="2" selected>v2 (evaluated worse than v1)</option>' in rollout


def test_a_canary_evaluated_as_well_as_the_stable_version_gets_no_warning(operator_page, canary_digits):
    evaluated_on_holdout(canary_digits, {1: 0.89, 2: 0.885})

    html = operator_page.get("/models/digits/promote/").content.decode() + release_panel(operator_page)

    assert "evaluated worse" not in html


# ---- what rollback and promote return to ---------------------------------------------------------------


def test_promote_says_a_rollback_afterwards_returns_to_the_last_all_stable_release(operator_page, canary_digits):
    html = operator_page.get("/models/digits/promote/").content.decode()

    assert "A rollback afterwards returns to v1 100% (generation 1), the last release that sent everything to v1." in html


def test_after_a_promote_the_rollback_confirmation_names_the_last_all_stable_release(operator_page, canary_digits, operator):
    releases.promote(canary_digits, operator)

    html = operator_page.get("/models/digits/rollback/").content.decode()

    assert "Traffic returns to <strong>v1 100% (generation 1)</strong>." in html
    assert "not to the canary split that preceded the promote" in html


# ---- drills roll forward ---------------------------------------------------------------------------------


def test_the_drill_confirmation_says_it_rolls_forward_by_default(operator_page, canary_digits):
    html = operator_page.get("/models/digits/drill/").content.decode()

    assert "By default it then <strong>rolls forward</strong>" in html
    assert '<input type="checkbox" name="roll_forward" value="on" checked> Roll forward: restore v1 90%, v2 10% afterwards' in html


def test_the_drills_page_says_drills_roll_forward_by_default(viewer_page, digits):
    assert "Drills roll forward by default" in viewer_page.get("/drills/").content.decode()


# ---- the audit timeline ---------------------------------------------------------------------------------


def audit(client) -> str:
    return client.get("/models/digits/?fragment=audit").content.decode()


def test_each_audit_event_links_the_release_in_force_at_its_time(viewer_page, digits, operator):
    uploaded = events.version_uploaded(digits.versions.get(number=2), operator)  # while generation 1 is in force
    releases.set_routes(digits, [{"version": 1, "weight": 80}, {"version": 2, "weight": 20}], operator, "try v2 on a fifth")

    html = audit(viewer_page)

    upload_entry = html[html.index(uploaded.message) - 600:html.index(uploaded.message)]
    assert 'href="/models/digits/releases/1/"' in upload_entry
    assert '<a class="event-release" href="/models/digits/releases/2/"' in html
    assert "Reason: “try v2 on a fifth”" in html


def test_an_event_before_the_first_release_links_none(viewer_page, operator):
    from registry.models import RegisteredModel

    model = RegisteredModel.objects.create(name="digits")
    events.model_created(model, operator)

    html = audit(viewer_page)

    assert "Model digits registered" in html and "event-release" not in html


def test_rollout_events_link_their_rollout(viewer_page, digits, operator):
    rollout = start_rollout(digits, operator)

    html = audit(viewer_page)

    assert f'<a class="event-rollout" href="/models/digits/rollouts/{rollout.pk}/">rollout #{rollout.pk}</a>' in html
    assert AuditEvent.objects.filter(kind="rollout", data__rollout=rollout.pk).exists()


def test_a_release_page_shows_its_split_reason_and_neighbours(viewer_page, canary_digits, operator):
    releases.rollback(canary_digits, operator, "p99 regressed")

    html = viewer_page.get("/models/digits/releases/2/").content.decode()

    assert "digits generation 2" in html and "Traffic: v1 90%, v2 10%" in html
    assert "v2 · 10%" in html
    assert 'A rollback from here returns to <a href="/models/digits/releases/1/">generation 1</a>' in html
    assert 'Replaced by <a href="/models/digits/releases/3/">generation 3</a> (rolled back)' in html
    assert 'href="/api/models/digits/release/?at=' in html


def test_an_unknown_release_is_a_404(viewer_page, digits):
    assert viewer_page.get("/models/digits/releases/99/").status_code == 404


# ---- 4xx beside 5xx ---------------------------------------------------------------------------------------


FOUR_HUNDREDS = [{"model": "digits", "version": 2, "requests": 20, "requests_per_s": 20.0, "errors": 1, "client_errors": 5}]


def test_the_live_figures_show_4xx_beside_5xx(viewer_page, canary_digits):
    report_from("w1", generation=2, versions=FOUR_HUNDREDS)

    html = viewer_page.get("/models/digits/?fragment=live-figures").content.decode()

    assert '<td class="num" data-field="error_rate">5%</td>\n      <td class="num" data-field="client_error_rate">25%</td>' in html


def test_the_workers_table_shows_4xx_beside_5xx(viewer_page, canary_digits):
    report_from("w1", generation=2, versions=FOUR_HUNDREDS)

    html = viewer_page.get("/workers/").content.decode()

    assert '<td class="num" data-field="error_rate">5%</td>\n      <td class="num" data-field="client_error_rate">25%</td>' in html


def test_the_versions_table_shows_the_last_hours_traffic_with_4xx_and_5xx(viewer_page, canary_digits):
    served(canary_digits, 2, 200, errors=2, client_errors=50)

    html = viewer_page.get("/models/digits/?fragment=versions-table").content.decode()

    assert '200 req <span class="hint">5xx 1% · 4xx 25%</span>' in html


def test_the_version_pages_rollup_carries_client_errors(viewer_page, canary_digits):
    served(canary_digits, 2, 200, client_errors=50)

    html = viewer_page.get("/models/digits/versions/2/").content.decode()

    assert '"client_errors": 50' in html


def test_the_whole_model_page_renders_before_during_and_after_a_rollout(operator_page, digits, operator):
    before = operator_page.get("/models/digits/")
    rollout = start_rollout(digits, operator)
    during = operator_page.get("/models/digits/")
    rollouts.abort(rollout, operator)
    after = operator_page.get("/models/digits/")

    assert [page.status_code for page in (before, during, after)] == [200, 200, 200]
    assert b'id="start-rollout"' in before.content and b'id="start-rollout"' not in during.content
    assert b'id="abort-rollout-dialog"' in during.content and b'id="to-stable-dialog"' in during.content
    assert b"<strong>Aborted</strong>" in after.content and b'id="start-rollout"' in after.content


# ---- a canary whose inputs differ from the stable version's -----------------------------------

SPLIT = "/models/digits/split/"


def test_an_incompatible_canary_is_marked_in_the_split_form_beside_a_force_box(operator_page, digits):
    incompatible_v3(digits)

    html = release_panel(operator_page)

    assert '<option value="3" selected data-incompatible="true">v3 (inputs differ from v1)</option>' in html
    assert 'id="split-force"' in html and 'id="id_split_force"' in html and 'id="id_split_reason"' in html


def test_after_an_incompatible_version_is_promoted_the_split_form_marks_the_versions_that_now_differ(operator_page, digits, operator):
    # v3 (8 inputs) forced to stable over v1 (4): a split to v1 or v2 was refused "tick Force
    # and say why in the reason", and the form had no Force box to tick, each version being
    # judged by its upload's report (compatible with v1, the stable then); v3 was marked
    # "inputs differ from v1" although it was the stable itself (a tired operator, 7 Dec).
    incompatible_v3(digits)
    releases.set_routes(digits, [{"version": 3, "weight": 100}], operator, "clients moved to 8 features", force=True)

    html = release_panel(operator_page)

    assert '<option value="2" selected data-incompatible="true">v2 (inputs differ from v3)</option>' in html
    assert '<option value="1" data-incompatible="true">v1 (inputs differ from v3)</option>' in html
    difference = escape("input 'input' dimension 1: 8 on v3, 4 here")
    assert (f'<p data-force-for="1">v1\'s inputs differ from v3\'s ({difference}): '
            'requests written for the stable version would be refused.</p>') in html
    assert 'id="split-force"' in html and 'id="id_split_force"' in html


def test_a_split_form_with_only_compatible_canaries_has_no_force_box(operator_page, digits):
    assert 'id="split-force"' not in release_panel(operator_page)


def test_an_unforced_incompatible_split_names_the_pages_force_control_not_the_apis(operator_page, digits):
    incompatible_v3(digits)
    before = releases_made()

    response = operator_page.post(SPLIT, {"canary_version": "3", "preset": "10", "expected_generation": "1"},
                                  HTTP_ACCEPT="application/json")

    assert response.status_code == 409
    assert response.json()["message"].endswith("clients would be refused: tick Force and say why in the reason to route traffic "
                                               "to it anyway")
    assert "force: true" not in response.json()["message"]
    assert releases_made() == before


def test_a_forced_split_needs_a_reason(operator_page, digits):
    incompatible_v3(digits)
    before = releases_made()

    body = {"canary_version": "3", "preset": "10", "force": "on", "reason": " ", "expected_generation": "1"}
    response = operator_page.post(SPLIT, body, HTTP_ACCEPT="application/json")

    assert response.status_code == 400
    assert response.json()["message"] == "force needs a reason: say why traffic goes to a version with incompatible inputs"
    assert releases_made() == before


def test_a_forced_split_with_a_reason_routes_the_incompatible_canary(operator_page, digits):
    incompatible_v3(digits)

    body = {"canary_version": "3", "preset": "10", "force": "on", "reason": "clients move to 8 features", "expected_generation": "1"}
    operator_page.post(SPLIT, body)

    release = digits.current_release()
    assert (release.routes, release.reason) == ([{"version": 1, "weight": 90}, {"version": 3, "weight": 10}], "clients move to 8 features")


def test_while_a_drill_runs_the_panel_links_to_it_instead_of_offering_another(operator_page, canary_digits, operator):
    # It offered "Run rollback drill", which the console then refused (409) (a tired operator, 7 Dec).
    from django.utils import timezone

    from registry.models import Drill

    drill = Drill.objects.create(model=canary_digits, actor=operator, started_at=timezone.now(), target_s=60.0, from_generation=2)

    html = release_panel(operator_page)

    assert 'id="drill-dialog"' not in html
    assert f'<a class="button" href="/drills/{drill.pk}/" id="drill-button">Drill #{drill.pk} running…</a>' in html


def test_while_a_drill_s_roll_forward_is_owed_the_panel_links_to_it_instead_of_offering_another(operator_page, canary_digits, operator):
    # A drill is refused (409) until its roll forward is made, which follows its end.
    from django.utils import timezone

    from registry.models import Drill

    drill = Drill.objects.create(model=canary_digits, actor=operator, started_at=timezone.now(), target_s=60.0, from_generation=2,
                                 status="passed", roll_forward=True, forward_pending=True)

    html = release_panel(operator_page)

    assert f'<a class="button" href="/drills/{drill.pk}/" id="drill-button">Drill #{drill.pk} rolling forward…</a>' in html


def test_a_gone_worker_behind_is_shown_behind_when_last_heard_not_as_serving_nothing(viewer_page, canary_digits):
    """A frozen worker still held its port: "it serves nothing now" was a guess, and its old
    generation had no highlight beside the current one."""
    report_from("w-frozen", generation=1, versions=[], seconds_ago=120)

    html = viewer_page.get("/workers/").content.decode()

    row = html[html.index('data-worker="w-frozen"'):]
    row = row[:row.index("</tr>")]
    assert "1 · behind when last heard</span>" in row and "pill-warn" in row
    assert "serves nothing now" not in row
