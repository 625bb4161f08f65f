"""The main pages on a phone (390 × 844 CSS pixels, an iPhone 12-14): nothing makes the
page pan sideways, and the figures an operator opens the page for (the split,
requests/s, p99, errors, convergence) are on screen without scrolling sideways. At
1280 px the same pages still show their tables as tables.

Screenshots: test-artifacts/phone-<page>.png.
"""

from __future__ import annotations

import re
import secrets
import time
from contextlib import contextmanager

import pytest
from playwright.sync_api import expect

from tests.browser.accessibility import assert_no_serious_violations
from tests.browser.conftest import WORKER_ID, django_shell, sign_in
from tests.browser.test_console_flow import Traffic

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
LIVE_S = 20_000  # ms: anything that waits for a worker's report
TOUCH_PX = 44
expect.set_options(timeout=10_000)

# The widest thing on the page, and the elements that stick out past the viewport
# without a scrolling box around them: what a failure needs to name.
OVERFLOW = """() => {
  const width = window.innerWidth;
  const contained = (element) => {
    for (let parent = element.parentElement; parent && parent !== document.body; parent = parent.parentElement) {
      if (getComputedStyle(parent).overflowX !== "visible") return true;
    }
    return false;
  };
  const offenders = [...document.body.querySelectorAll("*")]
    .filter((element) => { const box = element.getBoundingClientRect(); return box.width > 0 && box.right > width + 0.5 && !contained(element); })
    .slice(0, 10)
    .map((element) => `${element.tagName.toLowerCase()}${element.id ? "#" + element.id : ""}${[...element.classList].map((c) => "." + c).join("")} right=${Math.round(element.getBoundingClientRect().right)}`);
  return { scrollWidth: document.documentElement.scrollWidth, innerWidth: width, offenders };
}"""

# A finished drill of a model of this file's own, so the Drills page has a row whatever ran before.
DRILL = """
from datetime import timedelta
from django.utils import timezone
from registry.models import Drill, RegisteredModel
model = RegisteredModel.objects.create(name={name!r}, description="phone layout check")
started = timezone.now() - timedelta(seconds=30)
Drill.objects.create(model=model, status="passed", roll_forward=True, from_generation=2, to_generation=3, started_at=started,
                     finished_at=started + timedelta(seconds=2), first_ack_s=0.2, last_ack_s=0.4, confirmed_s=0.9, failed_requests=0,
                     target_s=5.0, workers=[{{"worker": "w1", "ack_s": 0.4, "ok": True, "confirmed": True, "error": ""}}])
"""


@contextmanager
def phone_signed_in(browser, stack, username: str):
    """A touch-screen phone-sized context; errors in the page fail the test."""
    context = browser.new_context(viewport=PHONE, device_scale_factor=1, is_mobile=True, has_touch=True, base_url=stack.console_url)
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, username)
    yield page
    context.close()
    assert errors == [], f"JavaScript errors in the page: {errors}"


@pytest.fixture
def phone(browser, stack):
    with phone_signed_in(browser, stack, "olivia") as page:  # an operator: the page with every control on it
        yield page


@pytest.fixture
def admin_phone(browser, stack):
    with phone_signed_in(browser, stack, "ada") as page:  # Users & roles is an admin's page
        yield page


@pytest.fixture(scope="module")
def drilled_model(stack) -> str:
    name = f"phone-{secrets.token_hex(3)}"
    django_shell(stack, DRILL.format(name=name))
    return name


def assert_no_sideways_pan(page) -> None:
    measured = page.evaluate(OVERFLOW)
    assert measured["innerWidth"] == PHONE["width"], measured
    # Against the phone's width, not innerWidth alone: a mobile browser may widen its
    # layout viewport to fit content that overflows.
    assert measured["scrollWidth"] <= PHONE["width"], measured


def assert_on_screen(locator) -> None:
    """Visible, and inside the viewport's width (scrolling down may be needed, sideways not)."""
    expect(locator).to_be_visible()
    box = locator.bounding_box()
    deadline = time.monotonic() + 5
    while box is None and time.monotonic() < deadline:  # a live update swapped the fragment in between
        time.sleep(0.1)
        box = locator.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 0.5, box


def test_models_page_on_a_phone_shows_split_and_traffic_without_panning(phone, stack):
    phone.goto("/")
    row = phone.locator("tr[data-model=digits]")
    for cell in ["td.col-split .split", '[data-field="requests_per_s"]', '[data-field="p99_ms"]', '[data-field="error_rate"]',
                 '[data-field="client_error_rate"]', 'td[data-label="Workers"]']:
        assert_on_screen(row.locator(cell))
    expect(row.locator('td[data-label="Workers"]')).to_contain_text("converged", timeout=LIVE_S)
    assert_no_sideways_pan(phone)
    stack.screenshot(phone, "phone-models")
    assert_no_serious_violations(phone, "phone-models")


def test_model_page_on_a_phone_fits_its_traffic_panel_charts_and_tables(phone, stack):
    phone.goto("/models/digits/")
    with Traffic(stack.worker_url):
        live = phone.locator("#live-table tr[data-role='stable']")
        expect(live.locator('[data-field="requests_per_s"]')).to_have_text(re.compile(r"[1-9]"), timeout=LIVE_S)
        for locator in [phone.locator("#release-panel .split"), phone.locator("#convergence"),
                        live.locator('[data-field="requests_per_s"]'), live.locator('[data-field="p99_ms"]'),
                        live.locator('[data-field="error_rate"]'), live.locator('[data-field="client_error_rate"]'),
                        phone.locator("#versions-table tr[data-version] td[data-label='Status']").first,
                        phone.locator("#audit .event").first]:
            assert_on_screen(locator)
        charts = phone.locator("#charts canvas")
        expect(charts.first).to_be_visible()
        for index in range(charts.count()):
            assert_on_screen(charts.nth(index))
        assert_no_sideways_pan(phone)
        stack.screenshot(phone, "phone-model")
        assert_no_serious_violations(phone, "phone-model")


def test_model_jobs_tab_on_a_phone_shows_each_job_as_a_card(phone, stack):
    phone.goto("/models/digits/jobs/")
    job = phone.locator("#jobs-table tr[data-job]").first
    for cell in ['[data-field="status"]', "td.progress-cell progress"]:
        assert_on_screen(job.locator(cell))
    assert_on_screen(phone.locator("#batch-form button[type=submit]"))
    assert_no_sideways_pan(phone)
    stack.screenshot(phone, "phone-model-jobs")


def test_version_page_on_a_phone_fits_its_benchmark_and_try_form(phone, stack):
    phone.goto("/models/digits/versions/1/")
    deadline = time.monotonic() + 90  # the demo's benchmark job runs in the stack's Celery worker
    while not phone.locator("table.benchmark").count() and time.monotonic() < deadline:
        time.sleep(2)
        phone.reload()
    at_1 = phone.locator("table.benchmark tr[data-batch-size='1']")
    for cell in ['td[data-label="Samples/s"]', 'td[data-label="p99"]']:
        assert_on_screen(at_1.locator(cell))
    assert_on_screen(phone.get_by_role("button", name="Send to v1"))
    assert_no_sideways_pan(phone)
    stack.screenshot(phone, "phone-version")


def test_workers_page_on_a_phone_shows_generation_and_traffic(phone, stack):
    phone.goto("/workers/")
    worker = phone.locator(f"tr[data-worker='{WORKER_ID}']")
    for cell in ['td[data-label="Generation"]', '[data-field="requests_per_s"]', '[data-field="error_rate"]', '[data-field="age"]']:
        assert_on_screen(worker.locator(cell))
    assert_no_sideways_pan(phone)
    stack.screenshot(phone, "phone-workers")


def test_drills_page_on_a_phone_shows_each_drill_as_a_card(phone, stack, drilled_model):
    phone.goto("/drills/")
    drill = phone.locator("tr[data-drill]").filter(has=phone.get_by_role("link", name=drilled_model, exact=True))
    for cell in ['td[data-label="Result"]', 'td[data-label="Last ack"]', 'td[data-label="Failed req."]']:
        assert_on_screen(drill.locator(cell))
    assert_no_sideways_pan(phone)
    stack.screenshot(phone, "phone-drills")


def test_users_page_on_a_phone_shows_each_user_as_a_labelled_card(admin_phone, stack):
    admin_phone.goto("/users/")
    user = admin_phone.locator("tr[data-user=olivia]")
    expect(user).to_have_css("display", "grid")
    for label in ["Email", "Role", "Status", "Last sign-in", "API token"]:
        cell = user.locator(f'td[data-label="{label}"]')
        assert_on_screen(cell)
        assert cell.evaluate("cell => getComputedStyle(cell, '::before').content") == f'"{label}"'
    assert_no_sideways_pan(admin_phone)
    stack.screenshot(admin_phone, "phone-users")


def test_navigation_on_a_phone_wraps_into_touch_sized_links(phone):
    phone.goto("/")
    for name in ["Models", "Workers", "Drills"]:
        link = phone.locator(".mainnav").get_by_role("link", name=name, exact=True)
        assert_on_screen(link)
        assert link.bounding_box()["height"] >= TOUCH_PX
    assert_on_screen(phone.get_by_role("button", name="Sign out"))
    assert_no_sideways_pan(phone)


def test_the_models_filters_and_the_rollout_plans_are_touch_sized_on_a_phone(phone, stack):
    # The search box was 36 px tall, the "Show archived" box and the plan radios 20 px.
    phone.goto("/")
    heights = {name: phone.locator(selector).bounding_box()["height"] for name, selector in [("search", "#id_q"),
                                                                                            ("archived", "label[for=id_archived]")]}
    phone.goto("/models/digits/")
    plans = phone.locator("#rollout-form label.check")
    if plans.count():  # no form while a rollout runs
        heights["plan"] = plans.first.bounding_box()["height"]

    assert all(height >= TOUCH_PX for height in heights.values()), heights


def test_the_jobs_tabs_file_inputs_are_touch_sized_on_a_phone(phone):
    # The browser's own file input was 21 px tall: its button alone is what a thumb finds.
    phone.goto("/models/digits/jobs/")
    heights = {selector: phone.locator(selector).bounding_box()["height"] for selector in ["#id_batch_input", "#id_dataset_file"]}

    assert all(height >= TOUCH_PX for height in heights.values()), heights


@pytest.mark.parametrize(("path", "table"), [
    ("/", "table.models"), ("/models/digits/", "#versions-table table"), ("/models/digits/jobs/", "#jobs-table table"),
    ("/workers/", "table.workers"), ("/drills/", "table.drills"),
])
def test_at_1280_px_the_same_pages_keep_their_tables(page, path, table, drilled_model):
    page.set_viewport_size(DESKTOP)
    sign_in(page, "olivia")
    page.goto(path)
    shown = page.locator(table)
    expect(shown.locator("thead")).to_be_visible()
    expect(shown).to_have_css("display", "table")
    expect(shown.locator("tbody tr").first).to_have_css("display", "table-row")
