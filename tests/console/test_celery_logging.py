"""What Celery beat writes when it cannot send a scheduled task: one line, not a stack."""

from __future__ import annotations

import logging

import celery.beat
from kombu.exceptions import OperationalError

from console.celery import OneLineSendErrors, app


def beat_send_error(*filters: logging.Filter) -> logging.LogRecord:
    """The record Celery beat's own ``apply_entry`` logs for a send its broker refused,
    through ``filters`` on beat's logger, as Celery's process has them."""
    records = []

    class Capture(logging.Handler):
        def emit(self, record):
            records.append(record)

    class Unsendable(celery.beat.Scheduler):
        def apply_async(self, entry, producer=None, advance=True, **kwargs):
            raise celery.beat.SchedulingError(f"Couldn't apply scheduled task {entry.name}: {OperationalError('Error 111 connecting')}")

    logger, handler = logging.getLogger("celery.beat"), Capture()
    # Exactly these filters: a Celery app set up earlier in this process added its own.
    kept, logger.filters = logger.filters, list(filters)
    logger.addHandler(handler)
    try:
        Unsendable.__new__(Unsendable).apply_entry(celery.beat.ScheduleEntry(name="rollout-tick", task="registry.tasks.tick", app=app))
    finally:
        logger.removeHandler(handler)
        logger.filters = kept
    return next(record for record in records if record.levelno == logging.ERROR)


def test_celery_beat_writes_an_unsent_task_with_its_stack_and_traceback():
    record = beat_send_error()

    assert "\n" in record.getMessage() and 'File "' in record.getMessage() and record.exc_info


def test_a_scheduled_task_beat_could_not_send_is_one_line_naming_the_error():
    record = beat_send_error(OneLineSendErrors())

    assert record.getMessage() == ("a scheduled task could not be sent (is Redis, the broker, up?): Couldn't apply scheduled task "
                                   "rollout-tick: Error 111 connecting")
    assert record.exc_info is None and record.stack_info is None
