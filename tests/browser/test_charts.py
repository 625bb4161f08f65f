"""Charts that remember, in a real browser against the running stack: real traffic to the
worker for a model of this file's own, then a reload draws the minutes before it on every
chart (from the reports the console stored, GET /api/models/{name}/series/), with a
labelled marker for each traffic change, also one made while the page is open; a version
keeps its colour across a promote; the range buttons answer the keyboard.

The charts' data and colours are read from the page (``window.modelPage.charts()``), not
from pixels. Screenshots land in test-artifacts/charts-*.png.
"""

from __future__ import annotations

import secrets
import time

import pytest
from playwright.sync_api import expect

from registry.building.onnx_build import random_mlp, to_bytes
from tests.browser.conftest import sign_in
from tests.browser.test_console_flow import Traffic

pytestmark = pytest.mark.browser

LIVE_S = 20_000  # ms: anything that waits for a worker's ack or report
LINE_CHARTS = ("requests_per_s", "latency", "error_rate", "queue_depth")
expect.set_options(timeout=10_000)


class Api:
    """The console's REST API as the signed-in operator in ``page`` calls it."""

    def __init__(self, page, stack):
        self.page, self.stack = page, stack

    def headers(self) -> dict:
        csrf = next(cookie["value"] for cookie in self.page.context.cookies() if cookie["name"] == "csrftoken")
        return {"X-CSRFToken": csrf, "Referer": self.stack.console_url + "/", "Accept": "application/json"}

    def post(self, path: str, **kwargs):
        response = self.page.request.post(path, headers=self.headers(), **kwargs)
        assert response.ok, (path, response.status, response.text())
        return response.json() if response.status != 204 else None

    def get(self, path: str) -> dict:
        response = self.page.request.get(path, headers={"Accept": "application/json"})
        assert response.ok, (path, response.status, response.text())
        return response.json()


def wait_until(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def upload(api: Api, model: str, seed: int) -> int:
    artifact = {"name": f"{model}-{seed}.onnx", "mimeType": "application/octet-stream", "buffer": to_bytes(random_mlp([8, 6, 4], seed=seed))}
    number = api.post(f"/api/models/{model}/versions/", multipart={"artifact": artifact, "description": "charts test"})["number"]
    wait_until(lambda: api.get(f"/api/models/{model}/versions/{number}/")["status"] == "ready", 90, f"{model} v{number} ready")
    return number


def set_split(api: Api, model: str, canary_weight: int) -> None:
    api.post(f"/api/models/{model}/release/", data={"routes": [{"version": 1, "weight": 100 - canary_weight}, {"version": 2, "weight": canary_weight}],
                                                     "reason": f"charts test: v2 at {canary_weight}%"})
    wait_converged(api, model)


def wait_converged(api: Api, model: str) -> None:
    wait_until(lambda: api.get(f"/api/models/{model}/release/")["converged"], 30, f"the worker serving {model}'s release")


@pytest.fixture(scope="module")
def charted(browser, stack):
    """A model of this file's own, v1 stable and v2 a 50% canary, that served real
    traffic for some seconds; its name."""
    model = f"charts-{secrets.token_hex(3)}"
    context = browser.new_context(base_url=stack.console_url)
    page = context.new_page()
    sign_in(page, "olivia")
    api = Api(page, stack)
    api.post("/api/models/", data={"name": model, "description": "the charts' own model"})
    seed = int(secrets.token_hex(3), 16)
    upload(api, model, seed)
    upload(api, model, seed + 1)
    wait_converged(api, model)
    set_split(api, model, 50)
    with Traffic(stack.worker_url, model, width=8, rate_per_s=40, malformed_every=10) as traffic:
        # Until the console stored what the tests read back: v2's requests, 4xx included,
        # in two of the charts' 5 s buckets (a fixed 12 s, before, for the same).
        wait_until(lambda: traffic.answers.get(200, 0) > 100 and traffic.answers.get(400, 0) > 5 and canary_buckets(api, model) >= 2, 60,
                   f"{model}'s v2 traffic in two 5 s buckets")
    context.close()
    assert traffic.answers.get(200, 0) > 100 and traffic.answers.get(400, 0) > 5, traffic.answers
    return model


def canary_buckets(api: Api, model: str) -> int:
    """The 5 s buckets of the last 15 minutes in which v2 answered requests, 4xx among them."""
    v2 = next((entry for entry in api.get(f"/api/models/{model}/series/?range=15m")["versions"] if entry["version"] == 2), None)
    if v2 is None:
        return 0
    return sum(1 for rate, errors in zip(v2["requests_per_s"], v2["client_error_rate"], strict=True) if rate and errors)


def open_model(page, model: str) -> None:
    page.goto(f"/models/{model}/")
    page.wait_for_function("() => window.modelPage && window.modelPage.loaded >= 1")


def points_before(page, moment_s: float) -> dict[str, int]:
    """Per line chart: how many points, of any series, lie before ``moment_s`` with a value."""
    return page.evaluate("""(moment) => Object.fromEntries(Object.entries(window.modelPage.charts()).map(([name, chart]) => {
        const [t, ...lines] = chart.data;
        return [name, lines.reduce((count, values) => count + values.filter((v, i) => v != null && t[i] < moment).length, 0)];
    }))""", moment_s)


def marker_labels(page) -> list[str]:
    return page.evaluate("() => window.modelPage.markers.map((marker) => marker.label)")


def series_color(page, chart: str, label_start: str) -> str:
    return page.evaluate("([chart, start]) => window.modelPage.charts()[chart].series.find((s) => s.label.startsWith(start)).color", [chart, label_start])


def test_a_reload_keeps_the_last_minutes_of_every_chart(page, stack, charted):
    sign_in(page, "victor")  # a viewer reads the past too
    open_model(page, charted)
    reloaded_at = page.evaluate("() => Date.now() / 1000")

    page.reload()
    page.wait_for_function("() => window.modelPage.loaded >= 1")

    before = points_before(page, reloaded_at)
    assert set(before) == set(LINE_CHARTS)
    assert all(count >= 2 for count in before.values()), before
    canary = page.evaluate("(moment) => { const h = window.modelPage.history; const s = h.series.get(2); "
                           "return h.t.filter((t, i) => t < moment && s.requests_per_s[i] > 0 && s.client_error_rate[i] > 0).length; }", reloaded_at)
    assert canary >= 2  # v2's own requests, 4xx included, from before the reload
    page.locator("#charts").scroll_into_view_if_needed()
    stack.screenshot(page, "charts-reloaded")


def test_a_traffic_change_is_a_marker_on_reload_and_live(page, stack, charted):
    sign_in(page, "olivia")
    open_model(page, charted)
    assert "v2 50%" in marker_labels(page)  # made before this page was opened

    set_split(Api(page, stack), charted, 20)

    page.wait_for_function("() => window.modelPage.markers.some((marker) => marker.label === 'v2 20%')", timeout=LIVE_S)
    in_view = page.evaluate("() => { const m = window.modelPage.markers.at(-1); return m.t > Date.now() / 1000 - 900 && m.t <= Date.now() / 1000 + 5; }")
    assert in_view
    page.locator("#charts").scroll_into_view_if_needed()
    stack.screenshot(page, "charts-live-marker")
    page.reload()
    page.wait_for_function("() => window.modelPage.loaded >= 1")
    assert marker_labels(page)[-2:] == ["v2 50%", "v2 20%"]


def test_the_range_buttons_work_from_the_keyboard(page, stack, charted):
    sign_in(page, "victor")
    open_model(page, charted)
    hour = page.get_by_role("button", name="Last 1 h")
    expect(page.get_by_role("button", name="Last 15 min")).to_have_attribute("aria-pressed", "true")
    # Loads so far, the 15 minutes' (a live message may have loaded them twice: "at least 2"
    # then passed on the 15 minutes' 5 s steps, once in a clean run).
    loaded = page.evaluate("() => window.modelPage.loaded")

    hour.focus()
    page.keyboard.press("Enter")

    expect(hour).to_have_attribute("aria-pressed", "true")
    page.wait_for_function(f"() => window.modelPage.range() === '1h' && window.modelPage.loaded > {loaded}")
    steps = page.evaluate("() => { const t = window.modelPage.charts().requests_per_s.data[0]; return t.length > 1 ? t[1] - t[0] : null; }")
    assert steps == 60  # per minute beyond 15 minutes
    stack.screenshot(page, "charts-range-1h")


def test_a_version_keeps_its_colour_across_a_promote(page, stack, charted):
    sign_in(page, "olivia")
    open_model(page, charted)
    api = Api(page, stack)
    release = api.get(f"/api/models/{charted}/release/")["release"]
    assert release["stable_version"] == 1
    split_v2 = page.locator("#release-panel .split-seg[title^='v2 ']")
    canary_chart, canary_bar = series_color(page, "requests_per_s", "v2"), split_v2.evaluate("(e) => getComputedStyle(e).backgroundColor")
    stable_before = series_color(page, "requests_per_s", "v1")

    api.post(f"/api/models/{charted}/release/promote/", data={"reason": "charts test"})

    expect(page.locator("#live-table tr[data-version='2']")).to_have_attribute("data-role", "stable", timeout=LIVE_S)
    page.wait_for_function("() => window.modelPage.charts().requests_per_s.series.some((s) => s.label === 'v2 stable')", timeout=LIVE_S)
    assert series_color(page, "requests_per_s", "v2 stable") == canary_chart != stable_before
    expect(split_v2).to_have_count(1)
    assert split_v2.evaluate("(e) => getComputedStyle(e).backgroundColor") == canary_bar
    swatch = page.locator("#live-table tr[data-version='2'] .swatch").evaluate("(e) => getComputedStyle(e).backgroundColor")
    assert swatch == canary_bar
    stack.screenshot(page, "charts-promoted")


def test_the_version_page_charts_its_past_with_the_markers(page, stack, charted):
    sign_in(page, "victor")
    page.goto(f"/models/{charted}/versions/2/")

    page.wait_for_function("() => window.versionPage && window.versionPage.loaded >= 1")

    served = page.evaluate("() => window.versionPage.series.requests_per_s.filter((v) => v > 0).length")
    assert served >= 1
    assert "v2 50%" in page.evaluate("() => window.versionPage.markers.map((marker) => marker.label)")
    page.locator("#rollup-charts").scroll_into_view_if_needed()
    stack.screenshot(page, "charts-version")


# Records what the charts' canvases are asked to draw: each label's text and box, and each
# dashed vertical line (a release marker), in the order drawn.
RECORD_CANVAS = """
(() => {
  const ops = (window.__canvasOps = []);
  const proto = CanvasRenderingContext2D.prototype;
  const { fillText, moveTo, lineTo } = proto;
  let from = null;
  proto.moveTo = function (x, y) { from = [x, y]; return moveTo.call(this, x, y); };
  proto.lineTo = function (x, y) {
    if (from && from[0] === x && this.getLineDash().length) ops.push({ op: "line", x, canvas: this.canvas });
    return lineTo.call(this, x, y);
  };
  proto.fillText = function (text, x, y) {
    ops.push({ op: "label", text, x, y, w: this.measureText(text).width, canvas: this.canvas });
    return fillText.call(this, text, x, y);
  };
})();
"""

CLOSE_RELEASES = ["v3 1%", "v3 10%", "v3 50%", "v3 100%", "promote v3", "rollback to v3 50%", "v3 10%", "rollback to v3 10%"]


def test_marker_labels_of_releases_seconds_apart_do_not_overlap(page, stack):
    """Eight traffic changes two seconds apart, at the right edge of a live chart at phone
    width: no label is struck through by another marker's line drawn over it, no two labels
    overlap, every label stays inside the plot, and the newest change keeps its label."""
    page.add_init_script(RECORD_CANVAS)
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(page, "olivia")
    open_model(page, "digits")
    drawn = page.evaluate("""async (labels) => {
        const box = document.createElement("div");
        box.style.width = "340px";
        document.body.append(box);
        const now = Date.now() / 1000;
        const markers = labels.map((label, i) => ({ t: now - 30 + 2 * i, label }));
        window.__canvasOps.length = 0;
        const { chart } = Charts.line(box, [{ label: "v1", color: "#2f6fdf" }], { windowS: 900, markers: () => markers });
        chart.setData([[now - 60, now - 1], [1, 2]]);
        const frames = () => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
        await frames();
        window.__canvasOps.length = 0;  // one draw's operations: the last
        chart.redraw(false, false);
        await frames();
        const canvas = box.querySelector("canvas");
        const bbox = chart.bbox;
        return { bbox: [bbox.left, bbox.top, bbox.left + bbox.width, bbox.top + bbox.height],
                 ops: window.__canvasOps.filter((op) => op.canvas === canvas && (op.op === "line" || labels.includes(op.text)))
                                        .map(({ canvas, ...op }) => op) };
    }""", CLOSE_RELEASES)
    ops, (left, _, right, _) = drawn["ops"], drawn["bbox"]
    labels = [(i, op) for i, op in enumerate(ops) if op["op"] == "label"]
    lines = [(i, op) for i, op in enumerate(ops) if op["op"] == "line"]
    assert len(lines) >= len(CLOSE_RELEASES), ops
    assert any(op["text"] == CLOSE_RELEASES[-1] for _, op in labels), f"the newest change lost its label: {ops}"
    for i, label in labels:
        span = (label["x"] - 1, label["x"] + label["w"] + 1)
        struck = [line["x"] for j, line in lines if j > i and span[0] < line["x"] < span[1]]
        assert not struck, f"{label['text']!r} is struck through by marker lines drawn after it at x={struck}"
        assert left <= label["x"] and label["x"] + label["w"] <= right, f"{label['text']!r} leaves the plot ({left}-{right}): {label}"
    for (_, a), (_, b) in ((x, y) for k, x in enumerate(labels) for y in labels[k + 1:]):
        same_row = abs(a["y"] - b["y"]) < 11
        assert not (same_row and a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]), f"{a['text']!r} overlaps {b['text']!r}"
