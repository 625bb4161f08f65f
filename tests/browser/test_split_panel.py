"""The release panel's canary share in a real browser, as a tired operator met it: another
version in the live canary's place opened no question (v2's 50% became v3's 10% at a
click, the 50% preset still shown pressed), the panel froze on the old split while the
cursor stayed in the Share box, and the answer was written above the fold."""

from __future__ import annotations

import os
import re
import secrets
import signal
import time

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import django_shell, sign_in

pytestmark = pytest.mark.browser

LIVE_S = 20_000
expect.set_options(timeout=10_000)

MAKE_MODEL = """
import io
from django.contrib.auth.models import User
from registry.actions import events, releases, uploads
from registry.building.onnx_build import random_mlp, to_bytes
from registry.models import RegisteredModel
olivia = User.objects.get(username="olivia")
model = RegisteredModel.objects.create(name={name!r}, description="made by the split panel's browser test")
events.model_created(model, olivia)
for seed in {seeds!r}:
    uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([8, 4], seed=seed))), uploaded_by=olivia)
print(releases.set_routes(model, {routes!r}, olivia, "").generation)
"""


def model_with_canary(stack, routes: list[dict]) -> tuple[str, int]:
    """A model of three versions (v1 stable) serving ``routes``; its name and generation."""
    name = f"split-{secrets.token_hex(3)}"
    seeds = [secrets.randbelow(10**6) + offset for offset in (3_000_000, 4_000_000, 5_000_000)]  # bytes no other version has
    generation = django_shell(stack, MAKE_MODEL.format(name=name, seeds=seeds, routes=routes), timeout_s=120).strip().splitlines()[-1]
    return name, int(generation)


def with_panel_polled(page, check, timeout_ms: float = LIVE_S) -> None:
    """``check(timeout_ms)`` (an ``expect``) once it holds, asking the page for its release
    panel once a second meanwhile. The page asks every 10 s by itself (model.js; its own
    test is test_live_refresh's health poll test): a worker's silence, or its return at the
    same generation, sends no event, and waiting for that poll cost these tests up to 20 s.
    Asked here through the page's own refresh, the same fetch and swap as the poll's."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        page.evaluate("() => window.ModelOps.refreshAll('health', 'release-panel')")
        try:
            check(1_000)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


def test_another_version_in_the_live_canarys_place_asks_first_and_cancel_sends_nothing(page, stack):
    name, generation = model_with_canary(stack, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    panel = page.locator("#release-panel")
    half = panel.get_by_role("button", name="50%", exact=True)
    expect(half).to_have_attribute("aria-pressed", "true")

    panel.get_by_label("Version").select_option("3")

    expect(half).not_to_have_attribute("aria-pressed", "true")  # v2's share, not v3's
    expect(panel.locator("#id_weight")).to_have_attribute("placeholder", "0-100")
    panel.get_by_role("button", name="10%", exact=True).click()
    dialog = page.locator("#replace-canary-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Replace the canary v2 50%?")
    expect(dialog).to_contain_text(f"v3 gets 10% of the traffic of {name}, and the canary v2 50% gets none; v1 gets the rest.")
    stack.screenshot(page, "split-replace-canary-confirm")
    dialog.get_by_role("link", name="Cancel").click()
    expect(dialog).to_be_hidden()
    expect(panel.locator("[data-generation]")).to_have_attribute("data-generation", str(generation))
    expect(panel.locator("#id_weight")).to_have_value("")  # a 10 left there would apply with no question on v2

    panel.get_by_role("button", name="100%", exact=True).click()

    full = page.locator("#full-share-dialog")
    expect(full).to_contain_text(f"v3 becomes the stable version and takes 100% of the traffic of {name}; v1 gets none, nor does the canary v2 50%.")


def test_with_two_canaries_the_question_names_only_the_one_replaced(page, stack):
    name, _ = model_with_canary(stack, [{"version": 1, "weight": 80}, {"version": 2, "weight": 10}, {"version": 3, "weight": 10}])
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    panel = page.locator("#release-panel")
    panel.get_by_label("Version").select_option("2")

    panel.get_by_role("button", name="50%", exact=True).click()

    dialog = page.locator("#replace-canary-dialog")
    expect(dialog).to_contain_text("Replace the canary v3 10%?")
    expect(dialog).to_contain_text(f"v2 gets 50% of the traffic of {name}, and the canary v3 10% gets none")


def test_a_confirmed_replacement_sends_the_share_of_the_preset_pressed(page, stack):
    name, generation = model_with_canary(stack, [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    panel = page.locator("#release-panel")
    panel.get_by_label("Version").select_option("3")

    panel.get_by_role("button", name="1%", exact=True).click()
    page.locator("#replace-canary-dialog").get_by_role("button", name="Replace the canary").click()

    expect(page.locator("#messages")).to_contain_text("traffic is now v1 99%, v3 1%")
    expect(panel.locator("[data-generation]")).to_have_attribute("data-generation", str(generation + 1), timeout=LIVE_S)


def test_the_panel_shows_the_new_split_while_the_cursor_stays_in_the_share_field(page, stack):
    name, generation = model_with_canary(stack, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    panel = page.locator("#release-panel")
    share = panel.locator("#id_weight")

    share.fill("20")
    share.press("Enter")

    expect(page.locator("#messages")).to_contain_text("traffic is now v1 80%, v2 20%")
    expect(panel.locator("[data-generation]")).to_have_attribute("data-generation", str(generation + 1), timeout=LIVE_S)
    expect(panel.get_by_role("button", name="10%", exact=True)).not_to_have_attribute("aria-pressed", "true")
    assert page.evaluate("document.activeElement.id") == "id_weight"  # the keyboard user keeps their place


def test_the_answer_to_a_button_low_on_a_short_screen_is_in_sight(page, stack):
    name, _ = model_with_canary(stack, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    page.set_viewport_size({"width": 1280, "height": 720})
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    preset = page.locator("#release-panel").get_by_role("button", name="50%", exact=True)
    preset.scroll_into_view_if_needed()
    page.mouse.wheel(0, 400)

    preset.click()

    message = page.locator("#messages .message").first
    expect(message).to_contain_text("traffic is now v1 50%, v2 50%")
    expect(message).to_be_in_viewport()
    message.get_by_role("button", name="Dismiss this message").click()
    expect(page.locator("#messages .message")).to_have_count(0)


SET_ROUTES = """
from django.contrib.auth.models import User
from registry.actions import releases
from registry.models import RegisteredModel
releases.set_routes(RegisteredModel.objects.get(name={name!r}), {routes!r}, User.objects.get(username="olivia"), "another operator")
"""


def test_a_panel_held_back_while_a_version_is_chosen_says_the_traffic_changed_meanwhile(page, stack):
    """Held back so as not to undo a choice, it showed the old split and its "✓ converged"
    for as long as the operator kept the focus in the form."""
    name, generation = model_with_canary(stack, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    panel = page.locator("#release-panel")
    panel.get_by_label("Version").select_option("3")
    panel.get_by_label("Version").focus()

    django_shell(stack, SET_ROUTES.format(name=name, routes=[{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]))
    page.evaluate("ModelOps.refreshAll('release-panel')")

    expect(panel.locator(".outdated-note")).to_contain_text(f"generation {generation + 1} is in force now, not {generation} as shown",
                                                             timeout=LIVE_S)
    expect(panel.get_by_label("Version")).to_have_value("3")  # the choice is still there


def test_a_changes_message_stops_saying_converging_once_the_workers_have(page, stack):
    """The message under a traffic change said "Workers are converging." for its whole 12 s,
    beside a panel that had long said every worker serves the new generation."""
    name, generation = model_with_canary(stack, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    panel = page.locator("#release-panel")
    panel.get_by_label("Version").select_option("2")

    panel.get_by_role("button", name="50%", exact=True).click()

    message = page.locator("#messages .message", has_text=f"Generation {generation + 1}:")
    expect(message).to_be_visible()
    expect(panel.locator("#convergence")).to_contain_text(f"serve generation {generation + 1}", timeout=LIVE_S)
    expect(message).to_contain_text(f"✓ All 1 live worker serve generation {generation + 1}.")
    expect(message).not_to_contain_text("converging")
    expect(message).to_have_class("message message-success")


def test_a_changes_message_follows_a_stopped_worker_to_not_converged_and_back(page, stack):
    """With the worker stopped the message went on saying "Workers are converging." (and,
    once it says the panel's warning, it must not keep saying it after the worker is back)."""
    name, generation = model_with_canary(stack, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    panel = page.locator("#release-panel")
    expect(panel.locator("#convergence")).to_contain_text(f"serve generation {generation}", timeout=LIVE_S)
    panel.get_by_label("Version").select_option("2")
    worker = next(process for process in stack.processes if "serve" in process.args)
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        panel.get_by_role("button", name="50%", exact=True).click()
        message = page.locator("#messages .message", has_text=f"Generation {generation + 1}:")
        # The panel's words, whichever it says first of a stack's only worker stopped.
        with_panel_polled(page, lambda timeout: expect(message).to_have_class("message message-warning", timeout=timeout))
        expect(message).to_contain_text(re.compile(r"Not converged: |No live workers are reporting\."))
        expect(message).not_to_contain_text("Workers are converging")
        stack.screenshot(page, "split-message-not-converged")
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    expect(message).to_contain_text(f"✓ All 1 live worker serve generation {generation + 1}.", timeout=LIVE_S)
    expect(message).to_have_class("message message-success")


def test_a_changes_message_that_turns_back_to_a_success_stays_12_s_from_then(page, stack):
    """A change's message made a warning by the panel ("Not converged": a stopped worker) and
    a success again near the end of its first 12 s was removed by that first timer as it
    turned, unread (the test above failed so now and then). The panel's swaps are played
    here on the page's own script, under a paused page clock."""
    name, generation = model_with_canary(stack, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    sign_in(page, "olivia")
    page.clock.install()
    page.goto(f"/models/{name}/")
    expect(page.locator("#release-panel #convergence")).to_be_attached()
    page.clock.pause_at(page.evaluate("Date.now()") + 1_000)
    changed = generation + 1
    page.evaluate("""(generation) => {
        const panel = document.getElementById("release-panel");
        panel.querySelector("[data-generation]").dataset.generation = generation;
        const convergence = panel.querySelector("#convergence");
        convergence.setAttribute("data-unsettled", "");
        convergence.innerHTML = '<span class="warn-text">Converging: w-1 on gen 2.</span>';
        ModelOps.flash("success", `Generation ${generation}: traffic is now v1 50%, v2 50%. Workers are converging.`, "traffic");
    }""", changed)
    message = page.locator("#messages .message", has_text=f"Generation {changed}:")
    swap = """([generation, settled, words]) => {
        const panel = document.getElementById("release-panel");  // a real refresh may have come meanwhile
        panel.querySelector("[data-generation]").dataset.generation = generation;
        const convergence = panel.querySelector("#convergence");
        convergence.toggleAttribute("data-unsettled", !settled);
        convergence.innerHTML = `<span class="${settled ? "ok-text" : "warn-text"}">${words}</span>`;
        document.dispatchEvent(new CustomEvent("modelops:swapped"));
    }"""

    page.evaluate(swap, [changed, False, "Not converged: w-1 stopped."])
    expect(message).to_have_class("message message-warning")
    page.clock.run_for(11_500)
    page.evaluate(swap, [changed, True, f"✓ All 1 live worker serve generation {changed}."])
    expect(message).to_have_class("message message-success")
    page.clock.run_for(1_000)  # the line's first 12 s are over

    expect(message).to_contain_text(f"✓ All 1 live worker serve generation {changed}.")
    page.clock.run_for(11_500)
    expect(message).to_have_count(0)


def test_the_drill_dialog_names_a_silent_worker_the_drill_would_wait_for(page, stack):
    """The dialog said the drill measures "every live worker", and the drill then failed on
    a worker killed 25 s before the click, which it waited for (silent under a minute)."""
    name, _ = model_with_canary(stack, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    panel = page.locator("#release-panel")
    page.locator("#drill-button").click()
    expect(page.locator("#drill-dialog")).to_be_visible()
    expect(page.locator("#drill-silent-warning")).to_have_count(0)  # every worker reports
    page.locator("#drill-dialog").get_by_role("link", name="Cancel").click()
    worker = next(process for process in stack.processes if "serve" in process.args)
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        with_panel_polled(page, lambda timeout: expect(panel.locator("#convergence")).to_contain_text("No live workers are reporting", timeout=timeout))
        page.locator("#drill-button").click()
        warning = page.locator("#drill-dialog #drill-silent-warning")
        expect(warning).to_contain_text(re.compile(r"It also waits for browser-worker \(silent \d+ s\): not reporting"))
        stack.screenshot(page, "split-drill-silent-worker")
        page.locator("#drill-dialog").get_by_role("link", name="Cancel").click()
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    with_panel_polled(page, lambda timeout: expect(panel.locator("#convergence")).to_contain_text("serve generation", timeout=timeout))


SET_ROUTES = """
from django.contrib.auth.models import User
from registry.actions import releases
from registry.models import RegisteredModel
print(releases.set_routes(RegisteredModel.objects.get(name={name!r}), {routes!r}, User.objects.get(username="ada"), "the other operator").generation)
"""


def test_a_rollback_refused_as_stale_keeps_the_reason_typed_for_it(page, stack):
    """Another operator changed the traffic while the rollback dialog was open: the rollback
    was refused as stale (rightly), and the reason typed for it was gone when the operator
    opened the dialog again to roll back from the new split."""
    name, generation = model_with_canary(stack, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    page.locator("#rollback-button").click()
    page.locator("#rollback-reason").fill("p99 regressed on v2, paging the SRE")
    django_shell(stack, SET_ROUTES.format(name=name, routes=[{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]))

    page.locator("#rollback-dialog").get_by_role("button", name="Roll back now").click()

    expect(page.locator("#messages .message-error")).to_contain_text(f"replaced generation {generation} you saw: nothing changed")
    panel = page.locator("#release-panel")
    expect(panel.locator("[data-generation]")).to_have_attribute("data-generation", str(generation + 1), timeout=LIVE_S)
    page.wait_for_timeout(700)  # console.js takes a click on the opener within 600 ms of a dialog's submit for a double-click's second
    page.locator("#rollback-button").click()
    expect(page.locator("#rollback-dialog")).to_be_visible()
    expect(page.locator("#rollback-dialog")).to_contain_text(f"Now: v1 50%, v2 50% (generation {generation + 1})")
    expect(page.locator("#rollback-reason")).to_have_value("p99 regressed on v2, paging the SRE")
    page.locator("#rollback-dialog").get_by_role("button", name="Roll back now").click()
    expect(page.locator("#messages .message-success")).to_contain_text(f"Generation {generation + 2}:")
    made = django_shell(stack, f"from registry.models import RegisteredModel; print(RegisteredModel.objects.get(name={name!r}).current_release().reason)")
    assert made.strip().splitlines()[-1] == "p99 regressed on v2, paging the SRE"


EVALUATE = """
from registry.models import EvaluationDataset, RegisteredModel
model = RegisteredModel.objects.get(name={name!r})
dataset = EvaluationDataset.objects.create(model=model, name="holdout", task="classification", file_format="npz", sha256="ab" * 32, size_bytes=10, rows=100)
for number, accuracy in {accuracies!r}.items():
    result = {{"dataset_sha256": dataset.sha256, "samples": 100, "accuracy": accuracy}}
    model.versions.filter(number=number).update(metrics={{"evaluation": {{"holdout": result}}}})
"""


def test_the_100_percent_question_says_only_of_the_chosen_version_that_it_was_evaluated_worse(page, stack):
    """A version at 11 % accuracy (stable 89 %) was sent to all the traffic without a word."""
    name, _ = model_with_canary(stack, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}])
    django_shell(stack, EVALUATE.format(name=name, accuracies={1: 0.89, 2: 0.11, 3: 0.895}))
    sign_in(page, "olivia")
    page.goto(f"/models/{name}/")
    panel = page.locator("#release-panel")
    full = page.locator("#full-share-dialog")
    worse = full.locator("[data-worse-for]")

    panel.get_by_label("Version").select_option("3")
    panel.get_by_role("button", name="100%", exact=True).click()
    expect(full).to_be_visible()
    expect(worse).to_have_count(1)
    expect(worse).to_be_hidden()  # v3 scored as well as v1
    full.get_by_role("link", name="Cancel").click()
    panel.get_by_label("Version").select_option("2")
    panel.get_by_role("button", name="100%", exact=True).click()

    expect(worse).to_be_visible()
    expect(worse).to_have_text("v2 was evaluated worse than the stable v1: accuracy 11.0% on holdout, against v1's accuracy 89.0%.")
