"""The audit timeline, the error pages, keyboard use and the accessibility check, in a
real browser against the running stack.

A model of this file's own (``audit-<hex>``, two versions made here, one release by ada
and two by olivia) keeps the demo model ``digits`` as the other tests expect it.
Screenshots: test-artifacts/audit-*.png; axe-core's findings: test-artifacts/axe-*.json.
"""

from __future__ import annotations

import csv
import io
import os
import re
import secrets
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.accessibility import assert_no_serious_violations
from tests.browser.conftest import django_shell, sign_in

pytestmark = pytest.mark.browser

LIVE_S = 20_000  # ms: anything that waits for a worker's ack
TAB_LIMIT = 120  # presses of Tab before a control counts as unreachable
expect.set_options(timeout=10_000)

HOSTILE_REASON = '=HYPERLINK("http://evil.example","click") canary by ada'
MAKE_MODEL = """
import io
from django.contrib.auth.models import User
from registry.actions import events, releases, uploads
from registry.building.onnx_build import random_mlp, to_bytes
from registry.models import RegisteredModel
olivia, ada = User.objects.get(username="olivia"), User.objects.get(username="ada")
model = RegisteredModel.objects.create(name={name!r}, description="made by the audit browser test")
events.model_created(model, olivia)
for seed in {seeds!r}:
    uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([8, 4], seed=seed))), uploaded_by=olivia)
canary = releases.set_routes(model, [{{"version": 1, "weight": 90}}, {{"version": 2, "weight": 10}}], ada, {reason!r})
releases.set_routes(model, [{{"version": 1, "weight": 100}}], olivia, "back to v1 while we look")
print(canary.generation)
"""


@dataclass(frozen=True)
class Audited:
    name: str
    canary_generation: int  # ada's release (generations count across all models)


@pytest.fixture(scope="module")
def audited(stack) -> Audited:
    """A model with v1 stable at 100%: v2 was a canary by ada, then olivia took it back;
    the model's timeline has both people and a hostile reason."""
    name = f"audit-{secrets.token_hex(3)}"
    seeds = [secrets.randbelow(10**6) + 1000, secrets.randbelow(10**6) + 2_000_000]  # bytes no other version has
    generation = django_shell(stack, MAKE_MODEL.format(name=name, seeds=seeds, reason=HOSTILE_REASON), timeout_s=120).strip().splitlines()[-1]
    return Audited(name=name, canary_generation=int(generation))


# ---------------------------------------------------------------- the audit timeline


def test_timeline_shows_reasons_links_the_release_made_and_filters_by_kind_and_person(page, stack, audited):
    sign_in(page, "olivia")
    page.goto(f"/models/{audited.name}/")
    made = f"made generation {audited.canary_generation}"
    timeline = page.locator("#audit")
    canary = timeline.locator(".event", has_text="ada").filter(has_text="Traffic changed")
    expect(canary).to_contain_text(f"Reason: “{HOSTILE_REASON}”")
    expect(canary.get_by_role("link", name=made)).to_have_attribute("href", f"/models/{audited.name}/releases/{audited.canary_generation}/")
    stack.screenshot(page, "audit-timeline")

    page.get_by_label("Kind").select_option(label="Traffic changed")
    page.get_by_label("Person").select_option("ada")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"\?kind=release&actor=ada"))
    expect(timeline.locator(".event")).to_have_count(1)
    expect(timeline.locator(".event")).to_contain_text("ada")
    stack.screenshot(page, "audit-timeline-filtered")

    timeline.get_by_role("link", name=made).click()
    page.wait_for_url(f"**/models/{audited.name}/releases/{audited.canary_generation}/")
    expect(page.locator("h1")).to_contain_text(str(audited.canary_generation))


def test_timeline_downloads_as_csv_with_the_filters_and_defused_formulas(page, stack, audited):
    sign_in(page, "victor")  # reading the timeline is every role's
    page.goto(f"/models/{audited.name}/?kind=release&actor=ada")
    with page.expect_download() as download:
        page.get_by_role("link", name=re.compile("Download CSV")).click()
    assert download.value.suggested_filename == f"{audited.name}-audit.csv"
    rows = list(csv.reader(io.StringIO(Path(download.value.path()).read_text(encoding="utf-8"))))
    assert rows[0] == ["time", "kind", "actor", "generation", "rollout", "reason", "message"]
    assert [row[1:4] for row in rows[1:]] == [["release", "ada", str(audited.canary_generation)]]
    assert rows[1][5] == "'" + HOSTILE_REASON  # a spreadsheet shows it, never runs it


def test_a_bad_filter_value_is_named_and_the_whole_timeline_shown(page, stack, audited):
    sign_in(page, "olivia")
    response = page.goto(f"/models/{audited.name}/?kind=nonsense")
    assert response.status == 400
    expect(page.locator(".audit-filter [role=alert]")).to_contain_text("kind: no audit kind 'nonsense'")
    expect(page.locator("#audit .event")).to_have_count(6)  # registered, two uploads, three releases


# ---------------------------------------------------------------- error pages


def test_403_page_is_styled_and_has_no_user_menu(page, stack):
    sign_in(page, "victor")
    response = page.goto("/models/digits/promote/")
    assert response.status == 403
    expect(page.get_by_role("heading", level=1)).to_have_text("Not allowed")
    expect(page).to_have_title(re.compile("Not allowed · ModelOps console"))
    assert page.locator(".topbar").evaluate("element => getComputedStyle(element).backgroundColor") == "rgb(17, 24, 39)"  # console.css loaded
    expect(page.get_by_role("button", name="Sign out")).to_have_count(0)  # nothing read the session
    expect(page.get_by_role("link", name="Back to the models")).to_be_visible()
    stack.screenshot(page, "audit-403")


def test_404_page_is_styled_and_offers_ways_on(page, stack):
    sign_in(page, "olivia")
    response = page.goto("/models/no-such-model-anywhere/")
    assert response.status == 404
    expect(page.get_by_role("heading", level=1)).to_have_text("Not found")
    assert page.locator(".panel").evaluate("element => getComputedStyle(element).backgroundColor") == "rgb(255, 255, 255)"
    expect(page.get_by_role("navigation", name="Ways on").get_by_role("link")).to_have_count(3)
    stack.screenshot(page, "audit-404")


# ---------------------------------------------------------------- keyboard


def tab_to(page, selector: str) -> None:
    """Press Tab from where focus is until ``selector`` has it (bounded)."""
    for _ in range(TAB_LIMIT):
        page.keyboard.press("Tab")
        if page.evaluate("selector => document.activeElement?.matches(selector) ?? false", selector):
            return
    raise AssertionError(f"{selector} not reached in {TAB_LIMIT} presses of Tab")


def focused_id_or_text(page) -> str:
    return page.evaluate("() => document.activeElement.id || document.activeElement.textContent.trim()")


def has_visible_focus(page) -> bool:
    return page.evaluate("() => { const style = getComputedStyle(document.activeElement); return style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) >= 2; }")


def test_keyboard_alone_sends_a_preset_share_and_rolls_it_back(page, stack, audited):
    sign_in(page, "olivia")
    page.goto(f"/models/{audited.name}/")
    page.locator("body").focus()

    tab_to(page, "#release-panel button[name=preset][value='10']")
    assert has_visible_focus(page)
    stack.screenshot(page, "audit-keyboard-preset-focused")
    page.keyboard.press("Enter")
    expect(page.locator("#messages")).to_contain_text("v1 90%, v2 10%")
    expect(page.locator("#release-panel .seg-canary")).to_contain_text("v2 · 10%")

    tab_to(page, "#rollback-button")
    assert has_visible_focus(page)
    page.keyboard.press("Enter")
    dialog = page.locator("#rollback-dialog")
    expect(dialog).to_be_visible()
    # The dialog's focus is on its reason: typing one went to the focused "Roll back now",
    # whose first space rolled back with no reason (a tired operator, 7 Dec).
    assert focused_id_or_text(page) == "rollback-reason"
    page.keyboard.type("rolled back with the keyboard")
    page.keyboard.press("Tab")
    assert has_visible_focus(page)
    page.keyboard.press("Space")
    expect(page.locator("#release-panel .seg-canary")).to_have_count(0)
    expect(page.locator("#audit .event").first).to_contain_text("rolled back with the keyboard")
    stack.screenshot(page, "audit-keyboard-rolled-back")


def test_typing_a_reason_as_a_promote_dialog_opens_goes_into_the_reason_and_promotes_nothing(page, stack, audited):
    """Its focused button took the first space typed: "v1 looks good" promoted, reason ''."""
    sign_in(page, "olivia")
    page.goto(f"/models/{audited.name}/")
    page.locator("#release-panel button[name=preset][value='10']").click()
    expect(page.locator("#release-panel .seg-canary")).to_contain_text("10%")
    generation = page.locator("#release-panel [data-generation]").get_attribute("data-generation")

    page.locator("#promote-button").click()
    page.keyboard.type("v2 looks good")

    expect(page.locator("#promote-reason")).to_have_value("v2 looks good")
    expect(page.locator("#promote-dialog")).to_be_visible()
    expect(page.locator("#release-panel .seg-canary")).to_contain_text("10%")
    assert page.locator("#release-panel [data-generation]").get_attribute("data-generation") == generation
    page.keyboard.press("Escape")  # leave the model as found: v1 alone (the restore test below needs a split to restore)
    page.locator("#rollback-button").click()
    page.locator("#rollback-dialog").get_by_role("button", name="Roll back now").click()
    expect(page.locator("#release-panel .seg-canary")).to_have_count(0)


def test_the_upload_is_reachable_by_keyboard_without_dragging(page, stack, audited):
    # Playwright turns file-chooser interception on with a message it does not wait for:
    # subscribed only at expect_file_chooser, the key could reach Chromium first and open
    # a chooser nobody sees (1 run in 4 here). Subscribed now, it is on long before the key.
    page.on("filechooser", lambda chooser: None)
    sign_in(page, "olivia")
    page.goto(f"/models/{audited.name}/")
    page.bring_to_front()  # keyboard focus and the file chooser belong to the front page only
    page.locator("body").focus()
    tab_to(page, "#id_artifact")
    expect(page.locator("#dropzone")).to_have_css("outline-style", "solid")  # where focus is, seen
    expect(page.locator("#id_artifact")).to_be_focused()
    with page.expect_file_chooser() as chooser:
        page.keyboard.press("Space")
    assert chooser.value.element.get_attribute("id") == "id_artifact"


# ---------------------------------------------------------------- accessibility (axe-core)


def signed_in_pages(model: Audited) -> dict[str, str]:
    return {
        "models": "/", "model": "/models/digits/", "model-audited": f"/models/{model.name}/", "version": "/models/digits/versions/1/",
        "workers": "/workers/", "drills": "/drills/", "jobs": "/models/digits/jobs/", "release": f"/models/{model.name}/releases/{model.canary_generation}/",
    }


@pytest.mark.parametrize("name", ["models", "model", "model-audited", "version", "workers", "drills", "jobs", "release"])
def test_signed_in_page_has_no_serious_accessibility_violations(page, stack, audited, name):
    sign_in(page, "olivia")
    page.goto(signed_in_pages(audited)[name])
    page.wait_for_load_state("networkidle")
    assert_no_serious_violations(page, name)


def test_login_page_has_no_serious_accessibility_violations(page, stack):
    page.goto("/login/")
    assert_no_serious_violations(page, "login")


@pytest.mark.parametrize(("name", "user", "path"), [("403", "victor", "/models/digits/promote/"), ("404", "olivia", "/no-such-page/")])
def test_error_page_has_no_serious_accessibility_violations(page, stack, name, user, path):
    sign_in(page, user)
    page.goto(path)
    assert_no_serious_violations(page, name)


def test_an_earlier_split_is_restored_from_its_release_page_through_its_dialog(page, stack, audited):
    # Last in this file: it leaves the audited model on ada's canary split again.
    sign_in(page, "olivia")
    page.goto(f"/models/{audited.name}/releases/{audited.canary_generation}/")

    page.get_by_role("link", name="Restore this split").click()
    dialog = page.locator("#restore-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Traffic goes back to v1 90%, v2 10%")
    dialog.get_by_label("Reason (optional)").fill("ada's canary again")
    dialog.get_by_role("button", name="Restore now").click()

    page.wait_for_url(f"**/models/{audited.name}/")
    expect(page.locator("#messages")).to_contain_text("traffic is now v1 90%, v2 10%")
    expect(page.locator("#release-panel .seg-canary")).to_contain_text("v2 · 10%")
    expect(page.locator("#audit .event").first).to_contain_text("ada's canary again")
    stack.screenshot(page, "audit-restored-from-release-page")


# The model on a canary split (it may be on one already: the restore test leaves it there).
SET_CANARY = """
from django.contrib.auth.models import User
from registry.actions import releases
from registry.models import RegisteredModel
try:
    releases.set_routes(RegisteredModel.objects.get(name={name!r}), [{{"version": 1, "weight": 90}}, {{"version": 2, "weight": 10}}],
                        User.objects.get(username="ada"), "a canary to roll back")
except releases.ReleaseConflict:
    pass
"""


def test_after_a_rollback_the_health_headline_follows_the_workers_not_only_its_poll(page, stack, audited):
    """The headline counted the workers converging until its own 10 s poll, after the
    release panel had shown them converged."""
    django_shell(stack, SET_CANARY.format(name=audited.name))
    sign_in(page, "olivia")
    page.goto(f"/models/{audited.name}/")
    health, convergence = page.locator("#model-health"), page.locator("#release-panel #convergence")
    expect(convergence).to_contain_text("serve generation", timeout=LIVE_S)
    shown = page.locator("#release-panel [data-generation]")
    before = shown.get_attribute("data-generation")
    worker = next(process for process in stack.processes if "serve" in process.args)
    os.kill(worker.pid, signal.SIGSTOP)  # the worker takes the rollback only once the headline showed it behind
    try:
        page.locator("#rollback-button").click()
        page.locator("#rollback-dialog").get_by_role("button", name="Roll back now").click()
        expect(health).to_contain_text("converging")
        expect(shown).not_to_have_attribute("data-generation", before)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    rollback = shown.get_attribute("data-generation")  # "serve generation" alone was also the text before the click
    with _logs_on_failure(stack, "worker", "console"):
        expect(convergence).to_contain_text(f"serve generation {rollback}", timeout=LIVE_S)
        expect(health).not_to_contain_text("converging", timeout=3_000)  # the poll is every 10 s


@contextmanager
def _logs_on_failure(stack, *names: str, lines: int = 25):
    """A failure says what the processes did meanwhile: whether the worker followed, and
    what the console answered (CI keeps only the test's output)."""
    try:
        yield
    except AssertionError as failure:
        tails = [f"--- {name}.log, last {lines} lines ---\n" + "\n".join((stack.data_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
                 for name in names]
        raise AssertionError("\n".join([str(failure), *tails])) from None


@pytest.mark.parametrize("when", ["at the click", "gone before the click", "before the page loaded"])
def test_a_drill_s_progress_counts_a_frozen_worker_as_not_following(page, stack, audited, when):
    """The progress line counted only the workers reporting: a frozen worker left it, and the
    line read "0 of 0 workers" while the drill waited for it. Then it counted those live at
    the click, while the server's drill also waits for workers silent under a minute
    (drills.RECENTLY_SILENT_S): a worker gone a few seconds before read "0 of 0" again.
    Then only those the page had heard from: one frozen before the page loaded was left out."""
    django_shell(stack, SET_CANARY.format(name=audited.name))
    sign_in(page, "olivia")
    worker = next(process for process in stack.processes if "serve" in process.args)
    if when == "before the page loaded":
        page.goto(f"/models/{audited.name}/")
        expect(page.locator("#live-note")).to_contain_text("1 live worker", timeout=LIVE_S)  # it reports
        os.kill(worker.pid, signal.SIGSTOP)
        page.goto(f"/models/{audited.name}/")  # a page that never hears from it
    else:
        page.goto(f"/models/{audited.name}/")
        expect(page.locator("#release-panel #convergence")).to_contain_text("serve generation", timeout=LIVE_S)
        expect(page.locator("#live-note")).to_contain_text("1 live worker", timeout=LIVE_S)  # the page has its report
        os.kill(worker.pid, signal.SIGSTOP)
    try:
        if when == "gone before the click":
            expect(page.locator("#live-note")).not_to_contain_text("1 live worker", timeout=LIVE_S)  # gone: WORKER_GONE_AFTER_S
        page.locator("#drill-button").click()
        page.locator("#drill-dialog").get_by_role("button", name="Start drill").click()
        status = page.locator("#drill-status")
        expect(status).to_contain_text(re.compile(r"Drill running: 0 of 1 worker serve generation \d+; 1 not reporting"), timeout=LIVE_S)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    expect(status).to_contain_text("Drill finished", timeout=LIVE_S)
