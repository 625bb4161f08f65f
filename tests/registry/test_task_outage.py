"""A scheduled task that meets an unavailable database skips that run with one warning
line, no error and no traceback; its next run does the work."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from console.tasks import prune_sign_in_records
from registry import tasks
from tests.console.test_commands_bad_input import ROOT, environment
from tests.console.test_outage import unreachable_database

pytestmark = pytest.mark.django_db(transaction=True)  # the test closes and reopens the connection


@pytest.mark.parametrize("task", [tasks.sweep_jobs, tasks.analyse_rollouts, tasks.abandon_stale_drills, tasks.apply_retention,
                                  prune_sign_in_records],
                         ids=lambda task: task.name)
def test_a_scheduled_task_skips_the_run_a_database_outage_stops_with_one_warning(task, caplog):
    with unreachable_database():
        result = task()

    said = [(record.levelname, record.getMessage(), record.exc_info) for record in caplog.records if record.levelno >= logging.WARNING]
    assert result is None
    name = task.name.rsplit(".", 1)[1]
    assert said == [("WARNING", f"{name} skipped: the database is unavailable (OperationalError); its next run tries again", None)]


def test_a_scheduled_task_runs_as_before_when_the_database_answers():
    assert tasks.sweep_jobs() == 0


@pytest.mark.django_db(transaction=False)
def test_a_scheduled_task_on_a_database_never_migrated_says_so_not_that_it_is_unavailable(tmp_path):
    # A Celery started by hand on a fresh DATA_DIR said "the database is unavailable" every few seconds.
    script = "import django; django.setup(); from registry import tasks; tasks.sweep_jobs()"
    finished = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=environment(tmp_path), capture_output=True, text=True,
                              timeout=60, check=False)

    assert finished.returncode == 0, finished.stderr
    assert ("sweep_jobs skipped: the database lacks what it needs (no such table: registry_job): it was not migrated, or is not "
            "the console's (check DATABASE_URL or DATA_DIR; `manage.py migrate`)") in finished.stderr, finished.stderr
