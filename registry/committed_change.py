"""A request that has committed a change says so, for the answer an outage cuts short.

Once a change is committed, the rest of its request still reads the database: what to
answer, the session's message. Should the database fail then, the 503 that
``console.outage`` would answer invites a retry, and a retry would make the change twice.
A view marks its request as soon as its change is committed; the outage's answer then
says the change was made.
"""

from __future__ import annotations

ATTRIBUTE = "committed_change"


def mark_committed(request, change: str) -> None:
    """``change``, in words (``"iris: generation 12"``), is committed by ``request``."""
    setattr(getattr(request, "_request", request), ATTRIBUTE, change)  # DRF's Request wraps Django's


def committed_change(request) -> str | None:
    return getattr(getattr(request, "_request", request), ATTRIBUTE, None)
