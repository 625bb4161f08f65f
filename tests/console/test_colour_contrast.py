"""Every status colour pair in the stylesheet meets WCAG AA (4.5:1) for its small text.

The browser accessibility check (axe-core) only judges the badges a page happens to show
when it runs: a "Validating" badge is on screen for a second or two after an upload, so
its contrast went unchecked until a slow run caught it. This reads the pairs from the
stylesheet itself, so every badge and pill is judged whether or not a page shows it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CSS = Path(__file__).resolve().parents[2] / "static" / "css" / "console.css"
AA_SMALL_TEXT = 4.5


def custom_properties(css: str) -> dict[str, str]:
    root = re.search(r":root\s*\{(.*?)\}", css, re.S).group(1)
    return dict(re.findall(r"(--[\w-]+):\s*(#[0-9a-fA-F]{6})\s*;", root))


def colour_pairs(css: str) -> list[tuple[str, str, str]]:
    """(selector, background, text colour) of each rule that sets both, variables resolved."""
    variables = custom_properties(css)

    def resolve(value: str) -> str:
        value = value.strip()
        match = re.fullmatch(r"var\((--[\w-]+)\)", value)
        return variables[match.group(1)] if match else value

    pairs = []
    for selector, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        background = re.search(r"(?:^|;)\s*background:\s*([^;]+)", body)
        colour = re.search(r"(?:^|;)\s*color:\s*([^;]+)", body)
        if background and colour:
            pairs.append((" ".join(selector.split()), resolve(background.group(1)), resolve(colour.group(1))))
    return [pair for pair in pairs if all(re.fullmatch(r"#[0-9a-fA-F]{6}", value) for value in pair[1:])]


def contrast(first: str, second: str) -> float:
    def luminance(hex_colour: str) -> float:
        channels = [int(hex_colour[index:index + 2], 16) / 255 for index in (1, 3, 5)]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    lighter, darker = sorted((luminance(first), luminance(second)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


PAIRS = colour_pairs(re.sub(r"/\*.*?\*/", "", CSS.read_text(), flags=re.S))


def test_the_stylesheet_has_status_colour_pairs_to_judge():
    selectors = " ".join(selector for selector, _, _ in PAIRS)
    for expected in (".badge-validating", ".badge-ready", ".badge-failed", ".pill-warn", ".pill-ok", ".pill-bad"):
        assert expected in selectors


def test_contrast_of_a_known_pair():
    assert contrast("#000000", "#ffffff") == pytest.approx(21.0)
    assert contrast("#9a6700", "#fff4d6") == pytest.approx(4.44, abs=0.01)  # what axe reported for the old amber


@pytest.mark.parametrize(("selector", "background", "colour"), PAIRS, ids=[pair[0] for pair in PAIRS])
def test_status_text_meets_aa_contrast_on_its_background(selector, background, colour):
    assert contrast(colour, background) >= AA_SMALL_TEXT, f"{selector}: {colour} on {background}"
