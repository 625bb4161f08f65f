"""A scheduled task that meets an unavailable database skips its run with one line.

Beat runs the sweeps every few seconds; during a database outage each run failed with
Celery's ERROR and a full traceback (a sweep every 10 s, a rollout tick more often),
burying the one line that says what is wrong. Each of these tasks is idempotent and
its next run does the work, so a run the outage stops is skipped, said in a warning.
"""

from __future__ import annotations

import functools
import logging

from django.db import DatabaseError

from registry.db_unavailable import is_database_unavailable

logger = logging.getLogger(__name__)


def skipped_during_outage(task):
    @functools.wraps(task)
    def run(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except DatabaseError as error:
            if not is_database_unavailable(error):
                raise
            logger.warning("%s skipped: the database is unavailable (%s); its next run tries again", task.__name__, type(error).__name__)
            return None
    return run
