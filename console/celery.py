"""The Celery app: tasks live in each app's ``tasks.py`` and take small arguments."""

import logging
import os
import signal
import sys
from pathlib import Path

from celery import Celery, signals

from serving.env import SettingError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")


def _one_line_for_a_setting_error(previous):
    """A bad value in the environment stops `celery -A console worker` (or beat) in
    Celery's command-line parsing, outside any handler of ours: the sentence naming the
    variable was the last of ~40 lines of traceback. It is one line, as manage.py says it."""

    def hook(kind, error, trace) -> None:
        if issubclass(kind, SettingError):
            sys.stderr.write(f"celery: {error}\n")
        else:
            previous(kind, error, trace)

    return hook


def _run_by_celerys_command() -> bool:  # `celery …` or `python -m celery …`; not manage.py, the ASGI server or a test
    program = Path(sys.argv[0] if sys.argv else "")
    return program.name == "celery" or program.parent.name == "celery"


if _run_by_celerys_command():
    sys.excepthook = _one_line_for_a_setting_error(sys.excepthook)

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
    beat = logging.getLogger("celery.beat")
    if not any(isinstance(existing, OneLineSendErrors) for existing in beat.filters):
        beat.addFilter(OneLineSendErrors())


class OneLineSendErrors(logging.Filter):
    """Beat logs a task it could not send (its broker, Redis, is down) with the stack it
    was called from and the exception's traceback: a 10 s Redis outage wrote 20 of them,
    ~490 lines, for one fact. Each is one line here, naming the send's error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("Message Error:") and record.args:
            record.msg, record.args = "a scheduled task could not be sent (is Redis, the broker, up?): %s", (record.args[0],)
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


MEMORY_BROKER_REFUSAL = ("REDIS_URL is not set, so Celery's broker would be memory://, which no other process reaches: this "
                         "process would never receive a task the console sends. Set REDIS_URL (and DATABASE_URL, or DATA_DIR) "
                         "to those of the console it works for")


def _on_a_broker_no_one_else_reaches() -> bool:
    """The settings fall back to memory:// for one-process use (a shell, unit tests); a
    Celery worker started by hand without REDIS_URL ran silently on it (an operator's
    fault run) and did nothing."""
    return str(app.conf.broker_url).startswith("memory://")


@signals.worker_init.connect
def _worker_refuses_the_memory_broker(**kwargs) -> None:
    if _on_a_broker_no_one_else_reaches():
        raise SystemExit(f"celery: {MEMORY_BROKER_REFUSAL}")


@signals.beat_init.connect
def _beat_refuses_the_memory_broker(**kwargs) -> None:
    # Beat's service catches SystemExit and exits 0 after a sync: it has to go at once.
    if _on_a_broker_no_one_else_reaches():
        sys.stderr.write(f"celery: {MEMORY_BROKER_REFUSAL}\n")
        sys.stderr.flush()
        os._exit(1)


@signals.beat_embedded_init.connect
def _die_with_the_worker(**kwargs) -> None:
    """`celery worker --beat` runs beat in a child process that outlived a worker killed
    with SIGKILL (a supervisor killing one PID, an OOM kill): an orphan beat went on
    scheduling, and a restarted worker started a second one. Celery gives its pool
    children a parent-death signal; beat gets one here (Linux only), then checks that its
    parent did not die before it was set."""
    import billiard.process
    from billiard.util import set_pdeathsig  # celery.platforms' own always sends SIGKILL

    try:
        set_pdeathsig(signal.SIGTERM)
    except OSError as error:  # not Linux: beat stops with its worker's graceful stop only
        logging.getLogger(__name__).warning("embedded beat %d cannot follow its worker: %s", os.getpid(), error)
        return
    parent = billiard.process.current_process()._parent_pid
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
    logging.getLogger(__name__).info("embedded beat %d stops with its worker %s", os.getpid(), parent)
