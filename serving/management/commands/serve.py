"""`manage.py serve`: run a serving worker with its control plane. Thin on purpose: no
ORM, no Django views; Django only supplies defaults (the worker token, Redis URL).

The console to follow is never guessed: a worker started by hand without ``CONSOLE_URL``
would otherwise take its states and artifacts from whatever answers on the default port.
``CONSOLE_URL`` comes from the environment, else from the console's ``CONSOLE_URL`` setting
(the address ``runstack`` recorded in DATA_DIR, console/console_address.py), else the
command refuses to start. A worker that follows those records (``CONSOLE_URL`` unset, and
``REDIS_URL`` unset for its Redis) reads them again when the address it uses stops
answering, and follows the stack to its new one (serving/control.py).
Logging is configured here, after Django's own ``LOGGING``, so that every worker line is
one JSON object (serving/logs.py) rather than whatever Django's handler prints."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from serving.config import ServingConfig
from serving.console_client import StateError, read_state_file
from serving.control import ControlPlane
from serving.env import SettingError, check_http_url, env_float, env_str, port_number
from serving.listen_check import TAKEN_HINT, listen_problem, listen_refusal
from serving.worker import Worker, configure_process, leave_the_code_tree, private_directory_remover

# The files `manage.py runstack` records the stack's addresses in, in DATA_DIR
# (console/console_address.py, which nothing outside the console imports).
CONSOLE_RECORD, REDIS_RECORD = "console-url", "redis-url"
RECORD_MAX_CHARS = 2000


class Command(BaseCommand):
    help = "Run a model serving worker (KServe V2 + /predict) with dynamic batching on ONNX Runtime."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=port_number, default=8001)
        parser.add_argument("--state-file", help="serve this desired-state JSON instead of asking the console (no control plane)")
        parser.add_argument("--public-url", type=_public_url,
                            help="URL this worker says it serves at, shown on the console's Workers page (never fetched; default http://HOST:PORT)")

    def handle(self, *args, host, port, state_file, public_url, **options):
        if state_file is not None:  # read again at start-up; a typo in its path is said here, not in a logged traceback
            try:
                read_state_file(state_file)
            except StateError as error:  # exit 2 like a file that reads but cannot be applied (Worker.serve)
                raise CommandError(str(error), returncode=2) from None
        problem = listen_problem(host, port)  # before the models load and the console hears of this worker
        if problem is not None:
            raise CommandError(listen_refusal(host, port, problem, TAKEN_HINT))
        config = ServingConfig.from_env()
        if not config.worker_token:
            config = dataclasses.replace(config, worker_token=settings.SERVING_WORKER_TOKEN)
        if state_file is None:
            config = dataclasses.replace(config, console_url=console_url())
        configure_process(config)
        config, state_file, private_directory = leave_the_code_tree(config, state_file)
        worker = Worker(config, state_file)
        worker.on_shutdown.append(private_directory_remover(private_directory))
        if state_file is None:
            follows_records = not env_str("CONSOLE_URL")
            ControlPlane(
                worker,
                redis_url=redis_url(),
                recorded_console_url=_record_reader(CONSOLE_RECORD) if follows_records else None,
                recorded_redis_url=_record_reader(REDIS_RECORD) if follows_records and not settings.REDIS_URL else None,
                channel_prefix=settings.CHANNEL_LAYER_PREFIX,
                public_url=public_url or f"http://{f'[{host}]' if ':' in host else host}:{port}",  # an IPv6 address in brackets
                reconcile_interval_s=env_float("SERVING_RECONCILE_INTERVAL_S", 3.0, minimum=0.1),
                report_interval_s=env_float("SERVING_REPORT_INTERVAL_S", 1.0, minimum=0.05),
            )
        worker.serve(host, port)



def _public_url(text: str) -> str:
    try:
        return check_http_url("--public-url", text)
    except SettingError:
        expected = "expected an http:// or https:// URL with a host, e.g. http://10.0.0.5:8001"
        raise argparse.ArgumentTypeError(f"{expected}, got {text!r}") from None


def console_url() -> str:
    """The console this worker follows: CONSOLE_URL, else the console's setting of that name."""
    url = env_str("CONSOLE_URL") or str(getattr(settings, "CONSOLE_URL", "") or "").strip()
    if not url:
        raise CommandError(
            "CONSOLE_URL is not set and no console of this DATA_DIR recorded its address (manage.py runstack does): name the "
            "console this worker takes its states and artifacts from, e.g. CONSOLE_URL=http://127.0.0.1:8000"
        )
    try:
        return check_http_url("CONSOLE_URL", url)
    except SettingError as error:
        if env_str("CONSOLE_URL"):
            raise CommandError(str(error)) from None
        # Not the operator's CONSOLE_URL, which is unset: the address runstack recorded in DATA_DIR.
        raise CommandError(f"the console address recorded in DATA_DIR={settings.DATA_DIR} is {url[:200]!r}: expected an http:// or "
                           "https:// URL with a host; set CONSOLE_URL, or start the stack again (manage.py runstack records it)") from None


def redis_url() -> str:
    """REDIS_URL; else, for a worker following the console runstack recorded, the Redis that
    stack recorded beside it (the push channel: without it a change waits for the next poll)."""
    if settings.REDIS_URL:
        return settings.REDIS_URL
    if env_str("CONSOLE_URL"):
        return ""  # a console named by hand: the recorded Redis may belong to another
    return settings.STACK_REDIS_URL


def _record_reader(file_name: str):
    """A callable that reads the address recorded in ``file_name`` again ("" when there is
    none or it cannot be read: the worker keeps the address it has)."""
    path = Path(settings.DATA_DIR) / file_name

    def read() -> str:
        try:
            with path.open() as file:
                return file.read(RECORD_MAX_CHARS).strip()
        except (OSError, ValueError):  # ValueError: not UTF-8
            return ""

    return read
