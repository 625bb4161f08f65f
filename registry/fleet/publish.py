"""Publishing the desired state to the ``serving`` group on the channel layer.

Every pushed state is signed with the console's push key (``registry.fleet.push_key``):
the channel is shared with anything that can reach Redis, and workers use only what the
console signed.
"""

from __future__ import annotations

import logging

from django.conf import settings

from registry.broadcast import send_to_group
from registry.fleet.issued_mark import note_issued
from registry.fleet.push_key import console_push_key
from registry.fleet.state import current_state
from serving.contract import APPLY_MESSAGE, SERVING_GROUP
from serving.state_signing import sign_push

logger = logging.getLogger(__name__)


def signed_desired_state() -> dict:
    return sign_push(current_state(), console_push_key())


def publish_desired_state() -> None:
    """Send the whole state; a failure is logged, not raised, since workers reconcile.

    It runs after the change's commit, so nothing here may fail the request: reading the
    state needs the database, which may have gone away since, and an error raised here
    would answer a committed change with a 503 that invites the client to make it twice.
    """
    try:
        state = signed_desired_state()
    except Exception as error:
        logger.warning("could not read the desired state to publish it (%s: %s); workers will catch up on reconcile",
                       type(error).__name__, str(error).strip()[:200])
        return
    note_issued(state["epoch"], state["generation"])  # before it can reach a worker
    try:
        send_to_group(SERVING_GROUP, {"type": APPLY_MESSAGE, "state": state})
    except Exception as error:
        # One line per lost push: while Redis is down every change loses one, and a
        # traceback each (some 45 lines of redis-py) buried the log; it stays at DEBUG.
        logger.warning("could not publish generation %s; workers will catch up on reconcile, picking the change up at their next one (%s)",
                       state["generation"], _named(error))
        logger.debug("publishing generation %s failed", state["generation"], exc_info=True)


def _named(error: BaseException) -> str:
    """``Type: message`` on one line; send_to_group's own timeout comes without a message."""
    message = " ".join(str(error).split())[:200]
    if not message and isinstance(error, TimeoutError):
        message = f"no answer within {settings.CHANNEL_SEND_TIMEOUT_S:g} s"
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
