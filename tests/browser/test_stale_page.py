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
    marks = page.locator("#release-panel .ok-text, #release-panel .pill-ok")
    expect(marks.first).to_be_visible(timeout=20_000)  # a green mark to strike: the workers converged

    page.context.set_offline(True)

    expect(page.locator("#messages")).to_contain_text("The console has not answered since", timeout=(REFRESH_S + 5) * 1000)
    expect(page.locator("body[data-unreachable]")).to_have_count(1)
    decorations = marks.evaluate_all("marks => marks.map(mark => getComputedStyle(mark).textDecorationLine)")
    assert decorations and all("line-through" in decoration for decoration in decorations), decorations

    page.context.set_offline(False)

    expect(page.locator("#messages")).to_contain_text("The console answers again", timeout=15_000)
    expect(page.locator("body[data-unreachable]")).to_have_count(0)


def test_a_page_whose_console_hangs_says_so_as_when_it_cannot_reach_it(page, stack):
    # A console that hangs (frozen: an operator's SIGSTOP, a host gone without a reset) fails
    # no request: the page's refreshes and its /healthz probe waited for ever, and the model
    # page went on saying "✓ All 1 live worker serve generation 25", in green, for as long
    # as anyone looked.
    sign_in(page, "olivia")
    page.goto("/models/digits/")
    expect(page.locator("#live-status")).to_have_text("Live")
    marks = page.locator("#release-panel .ok-text, #release-panel .pill-ok")
    expect(marks.first).to_be_visible(timeout=20_000)

    held = []  # the requests the console hangs on: never answered
    page.route(lambda url: "fragment=" in url or url.endswith("/healthz"), lambda route: held.append(route))

    # The release panel's next refresh (10 s), then /healthz asked after 5 s, unanswered for 5 s.
    expect(page.locator("#messages")).to_contain_text("The console has not answered since", timeout=(REFRESH_S + 15) * 1000)
    expect(page.locator("body[data-unreachable]")).to_have_count(1)
    decorations = marks.evaluate_all("marks => marks.map(mark => getComputedStyle(mark).textDecorationLine)")
    assert decorations and all("line-through" in decoration for decoration in decorations), decorations

    page.unroute_all()  # the console answers again

    expect(page.locator("#messages")).to_contain_text("The console answers again", timeout=15_000)
    expect(page.locator("body[data-unreachable]")).to_have_count(0)


def test_a_double_click_on_a_dialogs_button_sends_once_and_leaves_the_dialog_closed(page, stack):
    # The second click landed on "Roll back" under the dialog just closed: the dialog opened
    # again over the old panel, and its click was refused as stale.
    dialog = opened_dialog(page, stack, "rollback")

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
    dialog = opened_dialog(page, stack, "drill")
    dialog.locator("input[name=expected_generation]").evaluate("field => { field.value = '1'; }")  # a page long out of date

    dialog.locator("button[type=submit]").first.click()

    status = page.locator("#drill-status")
    expect(status).to_contain_text("Drill not run")
    expect(status).not_to_contain_text("finished")


def opened_dialog(page, stack, action: str):
    """The model page with a canary, and ``action``'s dialog opened from its button."""
    with_a_canary(page, stack)
    page.locator(f"#{action}-button").click()
    dialog = page.locator(f"#{action}-dialog")
    expect(dialog).to_be_visible()
    return dialog


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


def test_a_workers_row_drawn_behind_is_drawn_again_by_the_next_report(page, stack):
    # A worker's row drawn before its first confirmation said "behind" in yellow for good,
    # while the model page said every worker served the current generation.
    sign_in(page, "olivia")
    page.goto("/workers/")
    expect(page.locator("#live-status")).to_have_text("Live")
    row = page.locator("#workers-table tr[data-worker][data-lifecycle=serving]").first
    row.evaluate("row => { row.classList.add('behind'); row.dataset.drawnBehind = 'true'; }")  # as the server drew it then

    expect(page.locator("#workers-table tr[data-drawn-behind]")).to_have_count(0)  # the server's row replaced it


# A model of this test's own: digits' v1 three times, v3 taking 32 inputs where v1 takes 64
# (as its validation report says), v1 taking all traffic.
FORCE_MODEL = """
from django.contrib.auth import get_user_model
from registry.actions import releases
from registry.models import RegisteredModel
source = RegisteredModel.objects.get(name="digits")
model = RegisteredModel.objects.create(name={name!r}, description="force box check")
for number in (1, 2, 3):
    version = source.versions.get(number=1)
    version.pk, version.model, version.number = None, model, number
    if number == 3:
        version.signature = {{**version.signature, "inputs": [{{**version.signature["inputs"][0], "shape": ["batch", 32]}}]}}
        version.validation_report = {{**version.validation_report, "compatibility": {{
            "compatible": False, "stable_version": 1, "differences": ["input 'input' dimension 1: 64 on v1, 32 here"]}}}}
    version.save()
releases.set_routes(model, [{{"version": 1, "weight": 100}}], get_user_model().objects.get(username="olivia"), "force box check")
"""


def test_the_split_forms_force_box_speaks_only_of_the_version_chosen(page, stack):
    # It warned in red of v3's inputs, with a Force box, while v2 was chosen.
    import secrets

    from tests.browser.conftest import django_shell

    name = f"force-{secrets.token_hex(3)}"
    django_shell(stack, FORCE_MODEL.format(name=name))
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    panel = page.locator("#release-panel")
    box = panel.locator("#split-force")

    panel.get_by_label("Version").select_option("2")
    expect(box).to_be_hidden()
    panel.get_by_label("Version").select_option("3")
    expect(box).to_be_visible()
    expect(box).to_contain_text("v3's inputs differ from v1's")
    box.get_by_label("Force: route it anyway").check()
    panel.get_by_label("Version").select_option("2")

    expect(box).to_be_hidden()
    expect(panel.locator("#id_split_force")).not_to_be_checked()
