"""The release panel's canary share, as a tired operator uses it: another version in the
live canary's place is asked first (it had replaced v2's 50% with v3's 10% at a click),
the button pressed decides over what is left in the Share field, a stale page is told
it is stale, and a change that pauses a rollout says so."""

from __future__ import annotations

import re

import pytest
from django.contrib.messages import get_messages

from registry.actions import releases
from registry.domain.choices import RolloutStatus
from tests.console.conftest import add_version, start_rollout

pytestmark = pytest.mark.django_db
SPLIT = "/models/digits/split/"
JSON = {"HTTP_ACCEPT": "application/json"}


@pytest.fixture
def v2_at_half(digits, operator):
    """digits: v1 50%, v2 50% (generation 2), v3 ready and unrouted."""
    add_version(digits, 3)
    releases.set_routes(digits, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], operator)
    return digits


def routes_of(model) -> list[dict]:
    return model.current_release().routes


def test_another_version_in_the_live_canarys_place_is_asked_first_and_changes_nothing(operator_page, v2_at_half):
    response = operator_page.post(SPLIT, {"canary_version": "3", "preset": "10", "expected_generation": "2"})

    html = response.content.decode()
    assert response.status_code == 200
    assert "Replace the canary v2 50%?" in html
    assert re.search(r"v3</strong> gets <strong[^>]*>10%</strong> of the traffic of digits, and the canary <strong[^>]*>v2 50%</strong> gets none", html)
    assert '<input type="hidden" name="weight" value="10">' in html
    assert routes_of(v2_at_half) == [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]


def test_a_full_share_to_another_version_names_the_canary_it_takes_out(operator_page, v2_at_half):
    response = operator_page.post(SPLIT, {"canary_version": "3", "preset": "100", "expected_generation": "2"})

    html = response.content.decode()
    assert re.search(r"v3</strong> becomes the stable version and takes <strong>100%</strong> of the traffic of digits; v1 gets none"
                     r"<span data-replaced-clause>, nor does the canary <strong data-replaced>v2 50%</strong></span>", html)
    assert routes_of(v2_at_half) == [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]


def test_a_fetch_replacing_the_live_canary_unconfirmed_is_refused_naming_it(operator_page, v2_at_half):
    response = operator_page.post(SPLIT, {"canary_version": "3", "weight": "5", "expected_generation": "2"}, **JSON)

    assert response.status_code == 400
    assert response.json()["message"] == "v3 at 5% takes the place of the canary v2 50%: confirm it in the replacement dialog"
    assert v2_at_half.current_release().generation == 2


def test_a_confirmed_replacement_routes_the_new_canary(operator_page, v2_at_half):
    response = operator_page.post(SPLIT, {"canary_version": "3", "weight": "10", "confirmed_replace": "on", "expected_generation": "2"}, **JSON)

    assert response.status_code == 200
    assert routes_of(v2_at_half) == [{"version": 1, "weight": 90}, {"version": 3, "weight": 10}]


@pytest.mark.parametrize("body", [{"preset": "10"}, {"weight": "0"}, {"weight": "20 %"}])
def test_the_live_canarys_own_share_changes_without_a_question(operator_page, v2_at_half, body):
    response = operator_page.post(SPLIT, {"canary_version": "2", **body, "expected_generation": "2"}, **JSON)

    assert response.status_code == 200
    assert v2_at_half.current_release().generation == 3


def test_with_no_live_canary_another_version_needs_no_question(operator_page, digits):
    response = operator_page.post(SPLIT, {"canary_version": "2", "preset": "10", "expected_generation": "1"}, **JSON)

    assert response.status_code == 200
    assert routes_of(digits) == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]


def test_a_preset_is_applied_whatever_is_left_in_the_share_field(operator_page, digits):
    """"0.5" refused once stayed in the field and had the 1% preset refused for it."""
    response = operator_page.post(SPLIT, {"canary_version": "2", "preset": "1", "weight": "0.5", "expected_generation": "1"}, **JSON)

    assert response.status_code == 200
    assert routes_of(digits) == [{"version": 1, "weight": 99}, {"version": 2, "weight": 1}]


def test_a_stale_page_choosing_a_version_promoted_meanwhile_is_told_it_is_stale(operator_page, v2_at_half, operator):
    releases.promote(v2_at_half, operator, "")  # generation 3: v2 stable, so no longer a canary choice

    response = operator_page.post(SPLIT, {"canary_version": "2", "preset": "10", "expected_generation": "2"}, **JSON)

    assert response.status_code == 409
    assert response.json()["message"].startswith("generation 3 (canary promoted by ")
    assert response.json()["message"].endswith("replaced generation 2 you saw: nothing changed; reload and decide again")


def test_a_share_changed_during_a_rollout_says_the_rollout_is_paused(operator_page, digits, operator):
    rollout = start_rollout(digits, operator)  # generation 2: v2 at 1%

    response = operator_page.post(SPLIT, {"canary_version": "2", "preset": "50", "expected_generation": "2"}, **JSON)

    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.PAUSED
    assert response.json()["message"] == ("Generation 3: traffic is now v1 50%, v2 50%. Workers are converging. "
                                          f"Rollout #{rollout.pk} is paused by this change: resume it to go on, or abort it.")


def test_the_panel_says_a_share_change_pauses_the_running_rollout(operator_page, digits, operator):
    rollout = start_rollout(digits, operator)

    html = operator_page.get("/models/digits/").content.decode()

    assert f"Rollout #{rollout.pk} is running: a change here pauses it." in html


def test_the_panel_holds_the_replacement_dialog_only_while_a_canary_is_live(operator_page, v2_at_half, digits):
    html = operator_page.get("/models/digits/").content.decode()

    assert 'id="replace-canary-dialog"' in html
    assert 'data-live-canaries="2:50"' in html
    releases.rollback(digits, None, "")
    assert 'id="replace-canary-dialog"' not in operator_page.get("/models/digits/").content.decode()


def test_a_plain_form_post_of_a_confirmed_replacement_lands_on_the_model_with_its_message(operator_page, v2_at_half):
    response = operator_page.post(SPLIT, {"canary_version": "3", "weight": "10", "confirmed_replace": "on", "expected_generation": "2"})

    assert response.status_code == 302
    assert [str(message) for message in get_messages(response.wsgi_request)] == [
        "Generation 3: traffic is now v1 90%, v3 10%. Workers are converging."]
