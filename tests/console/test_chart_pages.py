"""The pages around the charts: range buttons with names, a version's colour by its
number (kept across a promote), and 5xx beside 4xx on the Version page's headline."""

from __future__ import annotations

import re

import pytest

from registry.actions import releases
from tests.console.conftest import served

pytestmark = pytest.mark.django_db


def segment_classes(html: str) -> dict[str, str]:
    """Split-bar segment title -> its version colour class."""
    return {title.split(" ")[0]: colour for colour, title in re.findall(r'class="split-seg [^"]*(vc-\d)[^"]*" title="([^"]+)"', html)}


def test_the_model_page_offers_four_ranges_as_named_buttons(viewer_page, digits):
    html = viewer_page.get("/models/digits/").content.decode()

    names = re.findall(r'<button type="button" class="button small" data-range="(\w+)" aria-pressed="(\w+)"><span class="visually-hidden">Last </span>([^<]+)</button>', html)
    assert names == [("15m", "true", "15 min"), ("1h", "false", "1 h"), ("6h", "false", "6 h"), ("24h", "false", "24 h")]


def test_a_canary_keeps_its_colour_when_it_is_promoted(operator_page, canary_digits, operator):
    before = segment_classes(operator_page.get("/models/digits/?fragment=release-panel").content.decode())
    releases.promote(canary_digits, operator)
    after = segment_classes(operator_page.get("/models/digits/?fragment=release-panel").content.decode())

    assert (before, after) == ({"v1": "vc-0", "v2": "vc-1"}, {"v2": "vc-1"})


def test_the_live_table_swatch_is_the_versions_colour(viewer_page, canary_digits):
    html = viewer_page.get("/models/digits/?fragment=live-figures").content.decode()

    assert re.findall(r'<span class="swatch (vc-\d)" aria-hidden="true"></span>v(\d)', html) == [("vc-0", "1"), ("vc-1", "2")]


def test_the_version_page_shows_the_last_hours_5xx_beside_its_4xx(viewer_page, canary_digits):
    served(canary_digits, 2, 200, errors=2, client_errors=50)

    html = viewer_page.get("/models/digits/versions/2/").content.decode()

    assert re.search(r'last hour: 200 req · <span class="error-text">5xx 1%</span> · <span class="warn-text">4xx 25%</span>', html)
