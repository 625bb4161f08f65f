"""A progressive rollout in a real browser against the running stack: an operator starts
one from the model page, watches its steps and the verdict of each window arrive (the
page polls the rollout API), sees the canary's 4xx fail a window and the health badge
name them, pauses, resumes and aborts it; the rollout's page charts every window.

The analysis is driven the way the Celery beat drives it: ``rollouts.tick`` in a
``manage.py shell`` on the stack's database, over report samples stored for the window.
Screenshots land in test-artifacts/ (15- to 21-).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import django_shell, sign_in

pytestmark = pytest.mark.browser

LIVE_S = 20_000  # ms: anything that waits for a worker's ack or the panel's next poll
expect.set_options(timeout=10_000)

# One window of traffic for both sides of the model's active rollout, judged at its end.
JUDGE_WINDOW = """
from datetime import timedelta
from registry.actions import rollouts
from registry.domain.choices import ACTIVE_ROLLOUT_STATUSES
from registry.fleet import samples
from registry.models import Rollout

def figures(number, client_errors):
    answered = 200 - client_errors
    return {{"model": "digits", "version": number, "requests": 200, "errors": 0, "client_errors": client_errors, "latency_sum_s": 0.3,
             "latency_buckets": {{"0.002": answered, "+Inf": answered}}, "batch_size_buckets": {{}}}}

rollout = Rollout.objects.get(model__name="digits", status__in=ACTIVE_ROLLOUT_STATUSES)
versions = {{version.number: version for version in rollout.model.versions.all()}}
at = rollout.next_window_at
samples.store("browser-test", [(versions[rollout.canary_version], figures(rollout.canary_version, {canary_client_errors})),
                               (versions[rollout.stable_version], figures(rollout.stable_version, 0))], received_at=at - timedelta(seconds=1))
print(rollouts.tick(at))
"""


def judge_window(stack, *, canary_client_errors: int = 0) -> None:
    judged = django_shell(stack, JUDGE_WINDOW.format(canary_client_errors=canary_client_errors)).strip().splitlines()[-1]
    assert judged == "1", "the tick judged no window"


def test_operator_runs_a_rollout_and_watches_each_window_judged(page, stack):
    sign_in(page, "olivia")
    page.goto("/models/digits/")
    ensure_a_second_version(page, stack)
    full_share_asks_first(page, stack)

    start_a_rollout(page, stack)
    see_a_window_pass(page, stack)
    see_a_window_fail_on_client_errors(page, stack)
    pause_and_resume(page, stack)
    abort(page, stack)
    see_the_rollouts_page(page, stack)


def ensure_a_second_version(page, stack) -> None:
    """The console flow uploads v2; run alone, this test uploads it itself."""
    if page.locator("#versions-table tr[data-version='2']").count():
        return
    page.locator("#id_artifact").set_input_files(str(stack.export_dir / "digits-demo-2.onnx"))
    expect(page.locator("#upload-result")).to_contain_text("v2 is ready")


def full_share_asks_first(page, stack) -> None:
    """100% to a canary replaces the stable: the preset opens a confirmation, as Promote does."""
    panel = page.locator("#release-panel")
    generation = panel.locator("[data-generation]").get_attribute("data-generation")
    panel.get_by_label("Version").select_option("2")
    panel.get_by_role("button", name="100%", exact=True).click()
    dialog = page.locator("#full-share-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Send 100% to v2?")
    expect(dialog).to_contain_text("v2 becomes the stable version and takes 100% of the traffic of digits")
    stack.screenshot(page, "15a-full-share-confirm")
    dialog.get_by_role("link", name="Cancel").click()
    expect(dialog).to_be_hidden()
    assert panel.locator("[data-generation]").get_attribute("data-generation") == generation  # nothing was sent
    # "1e2" is no whole number to the server: the page sends it to be refused, not asked as 100%.
    panel.locator("#id_weight").fill("1e2")
    panel.get_by_role("button", name="Set", exact=True).click()
    expect(page.locator("#messages")).to_contain_text("Enter a whole number")
    expect(dialog).to_be_hidden()
    assert panel.locator("[data-generation]").get_attribute("data-generation") == generation
    panel.locator("#id_weight").fill("")


def start_a_rollout(page, stack) -> None:
    panel = page.locator("#rollout-panel")
    expect(panel.locator("#rollout-form")).to_be_visible()
    panel.get_by_label("Canary version").select_option("2")
    expect(panel.get_by_role("radio", name="Standard: 1 → 10 → 50 → 100, 5 min per step")).to_be_checked()
    panel.get_by_role("textbox", name=re.compile("Reason")).fill("rollout from the browser test")
    stack.screenshot(page, "15-rollout-start")
    panel.get_by_role("button", name="Start rollout").click()

    expect(page.locator("#messages")).to_contain_text(re.compile(r"Rollout #\d+ started: v2 at 1% \(step 1 of 4\)"), timeout=LIVE_S)  # a redirect on two busy cores
    rollout = panel.locator("#rollout")
    expect(rollout.locator("[data-field=rollout-status]")).to_have_text("Running")
    expect(rollout.locator(".step-current")).to_contain_text("1%")
    expect(rollout.locator(".step")).to_have_count(4)
    expect(rollout).to_contain_text("No window judged yet")
    expect(panel.locator("#rollout-form")).to_have_count(0)
    expect(page.locator("#release-panel .seg-canary")).to_contain_text("v2 · 1%")
    expect(page.locator("#release-panel #convergence")).to_contain_text("serve generation", timeout=LIVE_S)
    stack.screenshot(page, "16-rollout-running")


def see_a_window_pass(page, stack) -> None:
    judge_window(stack)
    rollout = page.locator("#rollout")
    # The page polls the rollout API and re-renders the panel when a window was judged.
    expect(rollout.locator(".verdict")).to_contain_text("Window 1", timeout=LIVE_S)
    expect(rollout.locator(".verdict")).to_contain_text("✓ passed")
    expect(rollout.locator("#signals tr[data-signal=client_errors]")).to_have_class(re.compile("signal-pass"))
    expect(rollout.locator(".step-current")).to_contain_text("1%")  # a passing step holds its 5 min


def see_a_window_fail_on_client_errors(page, stack) -> None:
    judge_window(stack, canary_client_errors=200)
    rollout = page.locator("#rollout")
    expect(rollout.locator(".verdict")).to_contain_text("Window 2", timeout=LIVE_S)
    expect(rollout.locator(".verdict")).to_contain_text("✗ failed")
    client_errors = rollout.locator("#signals tr[data-signal=client_errors]")
    expect(client_errors).to_have_class(re.compile("signal-fail"))
    expect(client_errors.locator("td").first).to_have_text("100%")
    expect(rollout.locator("[data-field=failures]")).to_contain_text("1 of 2")
    expect(page.locator("#model-health")).to_have_text("Client errors 100% on canary v2 (stable 0%)", timeout=LIVE_S)
    # Both windows are on the charts, canary against stable.
    page.wait_for_function("() => window.rolloutPage.verdicts === 2", timeout=LIVE_S)
    expect(page.locator("#rollout-charts")).to_be_visible()
    page.locator("#rollout-charts").scroll_into_view_if_needed()
    stack.screenshot(page, "17-rollout-window-failed")


def pause_and_resume(page, stack) -> None:
    rollout = page.locator("#rollout")
    rollout.get_by_role("button", name="Pause").click()
    expect(page.locator("#messages")).to_contain_text("paused at step 1 of 4 (v2 at 1%)")
    expect(rollout.locator("[data-field=rollout-status]")).to_have_text("Paused")
    expect(rollout).to_contain_text("paused by olivia")
    stack.screenshot(page, "18-rollout-paused")

    rollout.get_by_role("button", name=re.compile("Resume step 1")).click()
    expect(page.locator("#messages")).to_contain_text("resumed: v2 at 1% (step 1 of 4)")
    expect(page.locator("#messages")).not_to_contain_text("paused at step")  # the resume's message replaced it
    expect(rollout.locator("[data-field=rollout-status]")).to_have_text("Running")
    expect(rollout.locator("[data-field=failures]")).to_contain_text("0 of 2")  # the step starts over


def abort(page, stack) -> None:
    rollout = page.locator("#rollout")
    rollout.get_by_role("link", name="Abort: v1 back to 100%").click()
    dialog = page.locator("#abort-rollout-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("returns to v1 100% at once")
    dialog.get_by_label("Reason (optional)").fill("client errors on the canary")
    stack.screenshot(page, "19-rollout-abort-confirm")
    dialog.get_by_role("button", name="Abort, back to v1").click()

    expect(page.locator("#messages")).to_contain_text(re.compile(r"Rollout #\d+ aborted: v1 is back to 100%"))
    expect(page.locator("#rollout .rollout-outcome")).to_contain_text("Aborted")
    expect(page.locator("#rollout .rollout-outcome")).to_contain_text("aborted by olivia (client errors on the canary)")
    panel = page.locator("#release-panel")
    expect(panel.locator(".seg-canary")).to_have_count(0)
    expect(panel.locator(".seg-stable")).to_contain_text("v1 · 100%")
    expect(panel.locator("#convergence")).to_contain_text("serve generation", timeout=LIVE_S)
    expect(page.locator("#rollout-form")).to_be_visible()  # another may start
    expect(page.locator("#audit .event-rollout").first).to_be_visible()
    stack.screenshot(page, "20-rollout-aborted")


def see_the_rollouts_page(page, stack) -> None:
    page.locator("#rollout .rollout-head a").click()
    page.wait_for_url(re.compile(r"/models/digits/rollouts/\d+/$"))
    expect(page.locator("table.windows tbody tr")).to_have_count(2)
    page.wait_for_function("() => window.rolloutPage.verdicts === 2", timeout=LIVE_S)
    expect(page.locator("#rollout-charts")).to_be_visible()
    stack.screenshot(page, "21-rollout-page")
