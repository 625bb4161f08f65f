"""Formatting for the console's templates: units the reader can take in at a glance."""

from __future__ import annotations

import json

from django import template
from django.utils import timezone

register = template.Library()


def _number(value) -> float | None:
    """A missing figure arrives as None, or as "" from a lookup on a missing row."""
    if value is None or value == "":
        return None
    return float(value)


# As many colours as static/js/charts.js VERSION_COLORS (and .vc-* in console.css).
VERSION_COLOR_COUNT = 8


@register.filter
def version_color(number) -> str:
    """The CSS class of a version's colour: it follows the number, not the role, so a
    canary keeps its colour once it is stable."""
    try:
        index = (max(int(number), 1) - 1) % VERSION_COLOR_COUNT
    except (TypeError, ValueError):
        return ""
    return f"vc-{index}"


@register.filter
def seconds(value) -> str:
    """0.1234 -> '0.123 s'; None -> '—' (not measured)."""
    value = _number(value)
    if value is None:
        return "—"
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


@register.filter
def ms(value) -> str:
    """Milliseconds: two significant figures under 1 ms (a tiny model's 0.015 ms read "0.0 ms")."""
    value = _number(value)
    if value is None:
        return "—"
    if 0 < value < 1:
        return f"{value:.2g} ms"
    return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"


@register.filter
def rate(value) -> str:
    """Requests per second, with one decimal only where it matters."""
    value = _number(value)
    if value is None:
        return "—"
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


@register.filter
def percent(fraction) -> str:
    """0.0123 -> '1.23%'; None -> '—'."""
    fraction = _number(fraction)
    if fraction is None:
        return "—"
    value = fraction * 100
    return f"{value:.0f}%" if value == int(value) else f"{value:.2f}%"


@register.filter
def ago(moment) -> str:
    """Compact age for tables: '4 s ago', '12 min ago', '3 h ago', '2 d ago'."""
    if moment is None:
        return "never"
    age_s = max((timezone.now() - moment).total_seconds(), 0)
    for limit_s, unit_s, unit in ((60, 1, "s"), (3600, 60, "min"), (86400, 3600, "h")):
        if age_s < limit_s:
            return f"{int(age_s // unit_s)} {unit} ago"
    return f"{int(age_s // 86400)} d ago"


@register.filter
def metric(value) -> str:
    """A recorded metric: floats to 4 significant digits, anything else as text."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


@register.filter
def shape(dimensions) -> str:
    """['batch', 64] -> '[batch, 64]'; None dimensions read as '?'."""
    if not isinstance(dimensions, (list, tuple)):
        return str(dimensions)
    return "[" + ", ".join("?" if item is None else str(item) for item in dimensions) + "]"


@register.filter
def get(mapping, key):
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.filter
def since(end, start):
    """Seconds from ``start`` to ``end`` (two datetimes); None when either is missing."""
    if end is None or start is None:
        return None
    return (end - start).total_seconds()


@register.filter
def filesize(size_bytes) -> str:
    """Bytes in binary units with three significant digits: '12.3 KiB'."""
    if size_bytes is None:
        return "—"
    size = float(size_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1024
    return f"{size:.3g} GiB"


@register.filter
def pretty_json(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


@register.filter
def likeliest(answer) -> str:
    """For an answer whose one output is a probability vector: 'class 7 (74.3%)'.
    Anything else (several outputs, logits, a batch) gets '' rather than a guess."""
    outputs = answer.get("outputs") if isinstance(answer, dict) else None
    if not isinstance(outputs, dict) or len(outputs) != 1:
        return ""
    values = next(iter(outputs.values()))
    if not isinstance(values, list) or len(values) < 2 or not all(isinstance(value, (int, float)) for value in values):
        return ""
    if min(values) < 0 or abs(sum(values) - 1) > 0.01:
        return ""
    best = max(range(len(values)), key=values.__getitem__)
    return f"class {best} ({values[best]:.1%})"


@register.filter
def count(value) -> str:
    """12345 -> '12,345'; None -> '—'."""
    value = _number(value)
    return "—" if value is None else f"{int(value):,}"


@register.filter
def duration(value) -> str:
    """Seconds as a person reads them: '42 s', '3 min 20 s', '2 h 5 min'; None -> '—'."""
    value = _number(value)
    if value is None:
        return "—"
    if value < 10:
        return f"{value:.1f} s"
    whole = round(value)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"
