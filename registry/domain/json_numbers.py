"""Numbers as JSON can hold them: a non-finite float becomes null.

Figures come from workers' reports (finite, by the contract) and are added, multiplied and
divided by the console; a sum of saturated values, or figures stored before a contract
limit existed, can still come out infinite. JSON has no Infinity: PostgreSQL and SQLite's
JSON checks refuse it and DRF's renderer raises, so one such figure failed every rollout
verdict of a window (the analysis jammed) and answered the charts' API with a 500.
"""

from __future__ import annotations

import math


def finite_or_null(value):
    """``value`` with every non-finite float, at any depth of dicts, lists and tuples, None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value
