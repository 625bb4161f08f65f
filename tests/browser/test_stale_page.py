"""A page never looks healthier than what it last heard: when the console stops answering it
says so and strikes its green marks, and a double-click on a dialog's button does not open
the dialog again over a panel not yet refreshed."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import sign_in
from tests.browser.test_rollout_flow import ensure_a_second_version

pytestmark = pytest.mark.browser

expect.set_options(timeout=10_000)
REFRESH_S = 10  # model.js refreshes the health and release panel this often


def test_a_page_that_cannot_reach_the_console_says_since_when_and_strikes_its_green_marks(page, stack):
    # With the stack stopped, the model page went on saying "✓ All 1 live worker serve
    # generation 58" under a grey "Live feed off" for as long as anyone looked.
    sign_in(page, "olivia")
    page.goto("/models/digits/")
    expect(page.locator("#live-status")).to_have_text("Live")

    page.context.set_offline(True)

    expect(page.locator("#messages")).to_contain_text("The console has not answered since", timeout=(REFRESH_S + 5) * 1000)
    expect(page.locator("body[data-unreachable]")).to_have_count(1)
    marks = page.locator("#release-panel .ok-text, #release-panel .pill-ok")
    if marks.count():
        assert "line-through" in marks.first.evaluate("element => getComputedStyle(element).textDecorationLine")

    page.context.set_offline(False)

    expect(page.locator("#messages")).to_contain_text("The console answers again", timeout=15_000)
    expect(page.locator("body[data-unreachable]")).to_have_count(0)


def test_a_double_click_on_a_dialogs_button_sends_once_and_leaves_the_dialog_closed(page, stack):
    # The second click landed on "Roll back" under the dialog just closed: the dialog opened
    # again over the old panel, and its click was refused as stale.
    with_a_canary(page, stack)
    page.locator("#rollback-button").click()
    dialog = page.locator("#rollback-dialog")
    expect(dialog).to_be_visible()

    # The two clicks of a double-click, the second where the button was: on the opener beneath.
    page.evaluate("""() => {
        [...document.querySelectorAll('#rollback-dialog button')].find((b) => b.textContent.includes('Roll back now')).click();
        document.getElementById('rollback-button').click();
    }""")

    expect(page.locator("#messages")).to_contain_text("traffic is now")
    expect(dialog).to_be_hidden()
    expect(page.locator("#messages .message-error")).to_have_count(0)


def test_a_drill_refused_before_it_ran_says_why_without_saying_it_finished(page, stack):
    # "Drill finished after 0.05 s in this browser. Drill not run: …" contradicted itself.
    with_a_canary(page, stack)
    page.locator("#drill-button").click()
    dialog = page.locator("#drill-dialog")
    expect(dialog).to_be_visible()
    dialog.locator("input[name=expected_generation]").evaluate("field => { field.value = '1'; }")  # a page long out of date

    dialog.locator("button[type=submit]").first.click()

    status = page.locator("#drill-status")
    expect(status).to_contain_text("Drill not run")
    expect(status).not_to_contain_text("finished")


def with_a_canary(page, stack):
    """The model page, signed in, with v2 at 10%: something to roll back. Its release panel."""
    sign_in(page, "olivia")
    page.goto("/models/digits/")
    ensure_a_second_version(page, stack)
    panel = page.locator("#release-panel")
    if "v2" not in (panel.locator(".seg-canary").all_inner_texts() or [""])[0]:  # the suite's stack is shared
        panel.get_by_label("Version").select_option("2")
        panel.get_by_role("button", name="10%", exact=True).click()
    expect(panel.locator(".seg-canary")).to_contain_text("v2")
    return panel
