"""Publishing the desired state to the ``serving`` group on the channel layer."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from registry.state import desired_state

logger = logging.getLogger(__name__)
SERVING_GROUP = "serving"


def publish_desired_state() -> None:
    """Send the whole state; a failure is logged, not raised, since workers reconcile."""
    state = desired_state()
    try:
        async_to_sync(get_channel_layer().group_send)(SERVING_GROUP, {"type": "serving.apply", "state": state})
    except Exception:  # noqa: BLE001 - any transport failure: workers catch up by polling
        logger.warning("could not publish generation %s; workers will catch up on reconcile", state["generation"], exc_info=True)
