"""How figures read on the console's pages (console/templatetags/console_tags.py)."""

from __future__ import annotations

import pytest

from console.templatetags.console_tags import ms


@pytest.mark.parametrize(("value", "shown"), [(0.015, "0.015 ms"), (0.5, "0.5 ms"), (0, "0.0 ms"), (4.04, "4.0 ms"), (250.4, "250 ms"),
                                              (None, "—")])
def test_milliseconds_keep_two_significant_figures_below_one(value, shown):
    assert ms(value) == shown
