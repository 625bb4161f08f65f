"""The Celery app: tasks live in each app's ``tasks.py`` and take small arguments."""

import logging
import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.after_setup_logger.connect
def _quiet_task_lines(**kwargs) -> None:
    """Beat runs the canary analysis every ROLLOUT_TICK_S: three INFO lines per run
    ("sending", "received", "succeeded") would bury everything else a `make run` prints. Failures
    still log (at ERROR), and tasks log what they did themselves."""
    for name in ("celery.app.trace", "celery.worker.strategy", "celery.beat"):
        logging.getLogger(name).setLevel(logging.WARNING)
