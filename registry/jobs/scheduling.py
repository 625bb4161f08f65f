"""Which jobs follow from what happened: a version became ready, a data set arrived.

Interface for the validation and upload paths; the jobs it queues are filled in with
the benchmark and evaluation handlers.
"""

from __future__ import annotations


def version_ready(version) -> list:
    """Queue the jobs a newly ready version gets; returns them."""
    return []
