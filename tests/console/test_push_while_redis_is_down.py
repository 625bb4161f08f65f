"""A desired state pushed while the channel layer's Redis is down is lost (workers pick
the change up at their next reconcile): one warning line says so and names the error,
where each lost push used to log a traceback of some 45 lines."""

from __future__ import annotations

import logging

import pytest

from console import redis_options
from registry.fleet.publish import publish_desired_state
from tools.stack import free_port

pytestmark = pytest.mark.django_db


def test_a_push_lost_while_redis_is_down_is_one_warning_line_naming_the_error_and_what_happens_next(digits, settings, caplog):
    settings.CHANNEL_LAYERS = redis_options.channel_layers(f"redis://127.0.0.1:{free_port()}/0", "down-test")  # refused

    publish_desired_state()

    [warning] = [record for record in caplog.records if record.name == "registry.fleet.publish" and record.levelno >= logging.WARNING]
    line = warning.getMessage()
    assert line.startswith(f"could not publish generation {digits.current_release().generation}; workers will catch up on reconcile")
    assert "(ConnectionError: Error 111 connecting to 127.0.0.1:" in line and "\n" not in line
    assert warning.exc_info is None
