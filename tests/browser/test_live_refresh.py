"""A live refresh of a fragment never undoes a choice the operator made in a form there and
has not sent: the next click sends what they chose, not the form's defaults. Hidden fields
still take the server's fresh values (the stale-form check rests on them)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import sign_in
from tests.browser.test_rollout_flow import ensure_a_second_version

pytestmark = pytest.mark.browser

expect.set_options(timeout=10_000)


def test_a_live_refresh_keeps_the_choices_made_in_a_form_and_takes_fresh_hidden_fields(page, stack):
    sign_in(page, "olivia")
    page.goto("/models/digits/")
    ensure_a_second_version(page, stack)
    form = page.locator("#rollout-panel #rollout-form")
    expect(form).to_be_visible()
    plans = form.get_by_role("radio")
    last_plan = plans.nth(plans.count() - 1)
    last_plan.check()
    form.get_by_role("textbox", name="Reason").fill("chosen before the refresh")
    fresh_generation = form.locator("input[name=expected_generation]").input_value()
    form.evaluate("f => { f.dataset.before = 'true'; f.elements.expected_generation.value = 'stale'; }")
    page.locator("h1").click()  # focus leaves the form: nothing holds the refresh back

    page.evaluate("ModelOps.refreshAll('rollout-panel')")

    expect(page.locator("#rollout-form[data-before]")).to_have_count(0)  # the server's copy replaced it
    expect(form.get_by_role("textbox", name="Reason")).to_have_value("chosen before the refresh")
    expect(form.get_by_role("radio").nth(plans.count() - 1)).to_be_checked()
    expect(form.locator("input[name=expected_generation]")).to_have_value(fresh_generation)


def test_a_form_that_made_a_change_cannot_send_again_until_it_holds_the_new_generation(page, stack):
    """A second click on a preset just after its answer sent the generation that answer had
    replaced: a red "replaced generation N you saw" over the change's own success."""
    sign_in(page, "olivia")
    page.goto("/models/digits/")
    ensure_a_second_version(page, stack)
    panel = page.locator("#release-panel")
    before = int(panel.locator("form:has(button[name=preset]) input[name=expected_generation]").first.input_value())
    page.evaluate("""() => document.addEventListener("modelops:changed", (event) => {
        window.buttonsAtAnswer = [...event.detail.form.querySelectorAll("button")].map((button) => button.disabled);
    }, { once: true })""")
    panel.get_by_label("Version").select_option("2")

    panel.get_by_role("button", name="50%", exact=True).click()

    expect(page.locator("#messages")).to_contain_text("v2 50%")
    assert all(page.evaluate("window.buttonsAtAnswer"))  # the answered copy stays shut
    fresh = panel.locator("form:has(button[name=preset]) input[name=expected_generation]").first
    expect(fresh).not_to_have_value(str(before))  # the refreshed copy holds the new generation...
    expect(panel.get_by_role("button", name="50%", exact=True)).to_be_enabled()  # ...and takes clicks again


def _settled_model_page(page) -> None:
    """The digits page with its feed on and a report heard: the refreshes those ask for are done."""
    sign_in(page, "olivia")
    page.goto("/models/digits/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "on", timeout=20_000)
    expect(page.locator("#live-note")).to_contain_text("live worker", timeout=20_000)
    page.wait_for_timeout(1_000)


def _marked_convergence(page) -> None:
    """Mark the release panel's copy, so a test sees when the server's copy replaces it."""
    page.locator("#convergence").evaluate("element => { element.dataset.before = 'true'; }")


def test_a_fragment_whose_refresh_failed_is_asked_for_again(page, stack):
    """A refresh that failed (a 503, a dropped connection) was given up: the event that asked
    for it, a worker's report naming another generation, comes once, and the panel kept
    showing the worker behind."""
    _settled_model_page(page)
    failed = []

    def fail_once(route):
        if failed:
            return route.continue_()
        failed.append(route.request.url)
        return route.fulfill(status=503, body="busy")

    page.route(lambda url: "fragment=release-panel" in url, fail_once)
    _marked_convergence(page)

    page.evaluate("ModelOps.refreshAll('release-panel')")

    expect(page.locator("#convergence[data-before]")).to_have_count(0, timeout=5_000)
    assert len(failed) == 1


def test_a_release_panel_not_showing_every_worker_on_its_release_is_refreshed_with_the_health_poll(page, stack):
    """The panel moved only on events: with every one of them lost, "Converging" stayed up
    after the workers had followed."""
    _settled_model_page(page)
    page.locator("#convergence").evaluate("element => { element.dataset.unsettled = ''; }")
    _marked_convergence(page)

    expect(page.locator("#convergence[data-before]")).to_have_count(0, timeout=13_000)  # the health poll is every 10 s
