"""The Celery control worker runs beat embedded (``celery worker --beat``), in a child
process. A worker killed with SIGKILL by a supervisor (or the kernel's OOM killer) used to
leave that beat running as an orphan: it went on scheduling, and the restarted worker
started a second one beside it."""

from __future__ import annotations

import signal

import psutil
import pytest
from django.db import connection

from tools.stack import make_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHILDREN_WAIT_S = 60
FOLLOW_WAIT_S = 10


def test_the_embedded_beat_stops_when_its_celery_worker_is_killed(tmp_path, settings):
    stack = make_stack(tmp_path, settings, connection.settings_dict)
    celery = stack.start_celery(jobs=False)
    worker = psutil.Process(celery.popen.pid)
    children = wait_until(lambda: worker.children() if len(worker.children()) >= 2 else None, CHILDREN_WAIT_S, 0.1)
    assert children, f"expected the pool's child and beat, found {worker.children()}\n{celery.log()}"
    try:
        celery.popen.send_signal(signal.SIGKILL)
        celery.popen.wait(timeout=10)

        left = wait_until(lambda: not [child for child in children if _alive(child)], FOLLOW_WAIT_S, 0.1)

        assert left, f"still running after their worker was killed: {[child.pid for child in children if _alive(child)]}\n{celery.log()}"
    finally:
        for child in children:  # by PID, whatever the outcome
            if _alive(child):
                child.kill()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
