"""Every box that scrolls sideways (``.scroll-x``, around a table wider than the page) is a
region a keyboard user can focus and scroll, and a screen reader names: axe's
scrollable-region-focusable (serious) found the version page's benchmark table overflowing
at 1280 px with no way to reach it but a mouse."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from tests.console.conftest import figures, judge_window, start_rollout

pytestmark = pytest.mark.django_db

EVALUATION = {"task": "classification", "samples": 10, "accuracy": 0.8, "classes": ["cat", "dog"],
              "per_class": {"cat": {"precision": 0.75, "recall": 1.0, "support": 6}, "dog": {"precision": 1.0, "recall": 0.5, "support": 4}},
              "confusion_matrix": [[6, 0], [2, 2]], "dataset_sha256": "ab" * 32, "job": 3, "measured_at": "2026-12-01T19:00:00+00:00"}


class ScrollBoxes(HTMLParser):
    """The attributes of every element with the class ``scroll-x``."""

    def __init__(self):
        super().__init__()
        self.found: list[dict] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if "scroll-x" in (attributes.get("class") or "").split():
            self.found.append(attributes)


def scroll_boxes(page, path: str) -> list[dict]:
    response = page.get(path)
    assert response.status_code == 200
    parser = ScrollBoxes()
    parser.feed(response.content.decode())
    return parser.found


def benchmark(*rows) -> dict:
    sizes = [{"batch_size": size, "runs": 100, "samples_per_s": rate, "p50_ms": 1.0, "p99_ms": 2.0} for size, rate in rows]
    return {"device": "cpu", "onnxruntime": "1.31.0", "sizes": sizes, "peak_rss_bytes": 1024**2, "session": {}, "job": 1,
            "measured_at": "2026-12-01T19:00:00+00:00"}


@pytest.fixture
def measured(digits):
    """v2 benchmarked beside the stable v1, and evaluated per class with its confusion matrix."""
    digits.versions.filter(number=1).update(metrics={"benchmark": benchmark((1, 800.0), (32, 10000.0))})
    digits.versions.filter(number=2).update(metrics={"benchmark": benchmark((1, 1000.0), (32, 9000.0)), "evaluation": {"holdout": EVALUATION}})
    return digits


@pytest.fixture
def judged_rollout(digits, operator) -> str:
    """The page of a rollout with one window judged: its windows and its last verdict's signals."""
    rollout = judge_window(start_rollout(digits, operator), canary=figures(2))
    return f"/models/digits/rollouts/{rollout.pk}/"


def assert_focusable_and_named(boxes: list[dict]) -> None:
    assert [(box.get("tabindex"), box.get("role")) for box in boxes] == [("0", "region")] * len(boxes)
    labels = [box.get("aria-label", "").strip() for box in boxes]
    assert all(labels) and len(set(labels)) == len(labels), labels  # a region's name tells it from the others on the page


def test_the_version_pages_benchmark_and_evaluation_tables_scroll_from_the_keyboard_under_their_own_names(viewer_page, measured):
    boxes = scroll_boxes(viewer_page, "/models/digits/versions/2/")

    assert len(boxes) == 3  # the benchmark beside the stable's, precision and recall per class, the confusion matrix
    assert_focusable_and_named(boxes)


def test_the_model_pages_evaluation_and_drill_tables_scroll_from_the_keyboard_under_their_own_names(viewer_page, digits):
    boxes = scroll_boxes(viewer_page, "/models/digits/")

    assert [box["id"] for box in boxes] == ["evaluation-table", "model-drills"]
    assert_focusable_and_named(boxes)


def test_the_jobs_tabs_tables_scroll_from_the_keyboard_under_their_own_names(viewer_page, digits):
    boxes = scroll_boxes(viewer_page, "/models/digits/jobs/")

    assert [box["id"] for box in boxes] == ["jobs-table", "datasets"]
    assert_focusable_and_named(boxes)


def test_a_rollouts_windows_and_signals_tables_scroll_from_the_keyboard_under_their_own_names(viewer_page, judged_rollout):
    boxes = scroll_boxes(viewer_page, judged_rollout)

    assert len(boxes) == 2  # the last verdict's signals, the windows judged
    assert_focusable_and_named(boxes)
