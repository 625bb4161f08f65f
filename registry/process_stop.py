"""Whether this console process has begun to stop, and since when.

A normal stop (SIGTERM or Ctrl-C: every compose stop and Kubernetes rolling update) makes
uvicorn close its listening socket and then finish the requests in flight, a drill's among
them. From that moment no worker's report or ack reaches this process, and a drill judged
the workers by that silence: "2 of 2 workers never confirmed … it stopped reporting" of
two workers that followed the rollback in 0.08 s and could only not say so
(``registry.actions.drills`` reads this to say the console stopped instead, and ends its
waits for the workers: the stop's grace, 10 s under compose before SIGKILL, is better spent
rolling forward than waiting for what cannot arrive. A rolling update's new console may
hear the workers meanwhile; this process does not wait for it, and says it could not measure).

Marked by the console's HTTP protocol (``console.http_protocol``), which uvicorn asks to
shut down, connection by connection, as it closes its socket; read here, since nothing
outside the console imports it.
"""

from __future__ import annotations

import threading
from datetime import datetime

from django.utils import timezone

_lock = threading.Lock()
_began_at: datetime | None = None


def mark_stopping() -> None:
    """This process takes no more connections from now on; only the first call counts."""
    global _began_at
    with _lock:
        if _began_at is None:
            _began_at = timezone.now()


def began_at() -> datetime | None:
    """When this process began to stop; None while it runs."""
    return _began_at
