"""How often one worker id may report: a token bucket kept on its row.

Every worker holds the same token, and a report costs the console a locked row, a
roll-up per version and a sample per version kept for an hour. A worker reporting in a
loop (a bug, a restart storm's reconnects, or a token in the wrong hands) stored about
5 MB of samples a second. Each id earns ``WORKER_REPORTS_PER_S`` reports a second and
may save up ``WORKER_REPORT_BURST`` of them; a report with none left is refused (429)
with the seconds until the next one. A refused report changes nothing, and a worker
that waits loses no figures: its next report's deltas cover the whole time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime


class TooSoon(Exception):
    """A report before its id has earned one; ``retry_after_s`` says when it will have."""

    def __init__(self, rate: float, retry_after_s: float):
        self.retry_after_s = retry_after_s
        super().__init__(f"this worker id reports faster than WORKER_REPORTS_PER_S ({rate:g} a second) allows: "
                         f"report again in {retry_after_s:.2f} s")


@dataclass(frozen=True)
class Bucket:
    rate: float  # reports a second an id earns
    burst: float  # reports an id may save up

    def spend(self, saved: float, last_at: datetime, now: datetime) -> float:
        """What is left after one report, ``saved`` being what was left after the report
        accepted at ``last_at``; TooSoon when none is."""
        elapsed_s = max((now - last_at).total_seconds(), 0.0)  # a clock stepped back earns nothing, takes nothing
        available = min(self.burst, saved + elapsed_s * self.rate)
        if available < 1.0:
            raise TooSoon(self.rate, (1.0 - available) / self.rate)
        return available - 1.0


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` takes whole seconds; never 0, which would mean at once."""
    return str(max(1, math.ceil(seconds)))
