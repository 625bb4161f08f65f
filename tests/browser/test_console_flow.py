"""The console in a real browser against the running stack: an operator uploads a
version, sends it 10% of the traffic, watches it live, rolls back, and runs a drill;
a viewer finds no controls and a forged change is refused.

Screenshots of every page land in test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import itertools
import random
import re
import threading

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import WORKER_ID, sign_in

pytestmark = pytest.mark.browser

LIVE_S = 20_000  # ms: anything that waits for a worker's ack or report
expect.set_options(timeout=10_000)  # two busy cores run the stack and the browser


class Traffic:
    """Requests to the worker's /predict for ``model`` from a background thread,
    ``rate_per_s`` a second, each ``width`` values wide; with ``malformed_every`` N, every
    Nth is 3 values wide, so 4xx answers show beside the 2xx."""

    def __init__(self, worker_url: str, model: str = "digits", *, width: int = 64, rate_per_s: float = 60, malformed_every: int = 0):
        self.worker_url, self.model, self.width, self.rate_per_s, self.malformed_every = worker_url, model, width, rate_per_s, malformed_every
        self.answers: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        rows = random.Random(0)
        with httpx.Client(base_url=self.worker_url, timeout=5) as client:
            for count in itertools.count():
                if self._stop.wait(1 / self.rate_per_s):
                    return
                malformed = self.malformed_every and count % self.malformed_every == 0
                inputs = [rows.randint(0, 16) for _ in range(3 if malformed else self.width)]
                try:
                    status = client.post("/predict", json={"model_name": self.model, "inputs": inputs}).status_code
                except httpx.HTTPError:
                    status = 0
                self.answers[status] = self.answers.get(status, 0) + 1


def test_operator_releases_a_canary_watches_it_rolls_back_and_drills(page, stack, tmp_path):
    page.goto("/login/")
    stack.screenshot(page, "01-sign-in")
    sign_in(page, "olivia")

    see_models_page(page, stack)
    page.get_by_role("link", name="digits", exact=True).click()
    page.wait_for_url("**/models/digits/")  # loaded, scripts included
    upload_is_refused_with_its_reason(page, stack, tmp_path)
    upload_second_version(page, stack)
    set_canary(page, stack, "10%")
    with Traffic(stack.worker_url) as traffic:
        watch_canary_traffic(page, stack)
        roll_back(page, stack)
        set_canary(page, stack, "10%", screenshot=None)
        try_version(page, stack)
        run_drill(page, stack)
    assert traffic.answers.get(200, 0) > 100, traffic.answers
    see_workers(page, stack)
    see_drills(page, stack)


def test_viewer_finds_no_controls_and_a_forged_change_is_refused(page, stack):
    sign_in(page, "victor")
    expect(page.locator("tr[data-model=digits]")).to_be_visible()
    stack.screenshot(page, "13-viewer-models")

    page.goto("/models/digits/")
    expect(page.locator(".readonly-note")).to_contain_text("operators change traffic")
    for control in ("#rollback-button", ".split-form", "#upload-form", "#drill-button", "button[name=preset]"):
        expect(page.locator(control)).to_have_count(0)
    stack.screenshot(page, "14-viewer-model")

    before = page.request.get("/api/models/digits/release/").json()["release"]["generation"]
    csrf = next(cookie["value"] for cookie in page.context.cookies() if cookie["name"] == "csrftoken")
    for action in ("rollback", "promote", "drill"):
        forged = page.request.post(f"/models/digits/{action}/", headers={"X-CSRFToken": csrf, "Referer": stack.console_url + "/"}, form={"reason": "forged"})
        assert forged.status == 403, action
    forged_split = page.request.post("/models/digits/split/", headers={"X-CSRFToken": csrf, "Referer": stack.console_url + "/"}, form={"canary_version": "1", "preset": "50"})
    assert forged_split.status == 403
    assert page.request.get("/api/models/digits/release/").json()["release"]["generation"] == before


# ---------------------------------------------------------------- operator steps


def see_models_page(page, stack) -> None:
    row = page.locator("tr[data-model=digits]")
    expect(row).to_contain_text("v1")
    expect(row).to_contain_text("1/1 converged", timeout=LIVE_S)
    stack.screenshot(page, "02-models")


def upload_is_refused_with_its_reason(page, stack, tmp_path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"these bytes are not an ONNX model")
    page.locator("#id_artifact").set_input_files(str(broken))
    expect(page.locator("#upload-result")).to_contain_text(re.compile(r"Refused \(HTTP 4\d\d\): \S+"))
    expect(page.locator("#audit")).to_contain_text("Upload refused")
    stack.screenshot(page, "03-model-upload-refused")


def upload_second_version(page, stack) -> None:
    page.get_by_label("Description of the new version (optional)").fill("MLP, uploaded from the browser test")
    page.locator("#id_artifact").set_input_files(str(stack.export_dir / "digits-demo-2.onnx"))
    expect(page.locator("#upload-result")).to_contain_text("v2 is ready")
    version = page.locator("#versions-table tr[data-version='2']")
    expect(version.locator(".badge")).to_have_text("Ready")
    expect(version).to_contain_text("olivia")
    stack.screenshot(page, "04-model-uploaded")


def set_canary(page, stack, share: str, screenshot: str | None = "05-model-canary-10") -> None:
    panel = page.locator("#release-panel")
    panel.get_by_label("Version").select_option("2")
    panel.get_by_role("button", name=share, exact=True).click()
    expect(page.locator("#messages")).to_contain_text("v1 90%, v2 10%")
    expect(panel.locator(".seg-canary")).to_contain_text("v2 · 10%")
    expect(panel.locator("#convergence")).to_contain_text("serve generation", timeout=LIVE_S)
    if screenshot:
        stack.screenshot(page, screenshot)


def watch_canary_traffic(page, stack) -> None:
    canary = page.locator("#live-table tr[data-version='2']")
    expect(canary).to_have_attribute("data-role", "canary")
    page.wait_for_function(
        "() => parseFloat(document.querySelector(\"#live-table tr[data-version='2'] [data-field=requests_per_s]\").textContent) > 0",
        timeout=LIVE_S,
    )
    # The chart moves: the canary's requests/s series has non-zero points.
    page.wait_for_function(
        "() => (window.modelPage.history.series.get(2)?.requests_per_s || []).filter((v) => v > 0).length >= 5",
        timeout=LIVE_S,
    )
    stack.screenshot(page, "06-model-live-traffic")


def roll_back(page, stack) -> None:
    page.locator("#rollback-button").click()
    dialog = page.locator("#rollback-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Traffic returns to v1 100%")
    stack.screenshot(page, "07-model-rollback-confirm")
    dialog.get_by_label("Reason (optional)").fill("canary check from the browser test")
    dialog.get_by_role("button", name="Roll back now").click()
    panel = page.locator("#release-panel")
    expect(panel.locator(".seg-canary")).to_have_count(0)
    expect(panel.locator(".seg-stable")).to_contain_text("v1 · 100%")
    expect(page.locator("#audit .event").first).to_contain_text("Rolled back generation")
    expect(page.locator("#audit .event").first).to_contain_text("traffic back to v1 100%")
    expect(panel.locator("#convergence")).to_contain_text("serve generation", timeout=LIVE_S)
    stack.screenshot(page, "08-model-rolled-back")


def run_drill(page, stack) -> None:
    page.goto("/models/digits/")
    page.locator("#drill-button").click()
    dialog = page.locator("#drill-dialog")
    expect(dialog).to_contain_text("traffic returns to v1 100%")
    dialog.get_by_role("button", name="Start drill").click()
    status = page.locator("#drill-status")
    expect(status).to_contain_text("Drill")
    expect(status).to_contain_text("Drill finished", timeout=LIVE_S)
    last = page.locator(".last-drill")
    expect(last).to_contain_text("time to last ack")
    expect(last.locator(".badge")).to_have_text("Passed")
    expect(last).to_contain_text("0 failed requests")
    stack.screenshot(page, "09-model-drill-passed")


def try_version(page, stack) -> None:
    """While v2 is the canary, so the worker has it loaded."""
    page.goto("/models/digits/versions/2/")
    expect(page.locator("table.signature")).to_contain_text("probabilities")
    page.get_by_role("button", name="Send to v2").click()
    expect(page.locator("#try-result")).to_contain_text("Answered by v2", timeout=LIVE_S)
    expect(page.locator("#try-result")).to_contain_text("ms at the worker")
    stack.screenshot(page, "10-version")


def see_workers(page, stack) -> None:
    page.goto("/workers/")
    row = page.locator(f"tr[data-worker='{WORKER_ID}']")
    expect(row).to_contain_text("cpu")
    expect(row).to_contain_text("digits v1")
    expect(row).not_to_have_class(re.compile("gone"))
    stack.screenshot(page, "11-workers")


def see_drills(page, stack) -> None:
    page.goto("/drills/")
    expect(page.locator("table.drills tbody tr").first.locator(".badge")).to_have_text("Passed")
    stack.screenshot(page, "12-drills")
