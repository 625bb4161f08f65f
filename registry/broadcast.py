"""Messages to a Channels group from request and task code, bounded in time.

Every send here is news that has another way to arrive (workers reconcile, pages poll), so
a send that Redis does not answer within CHANNEL_SEND_TIMEOUT_S is given up instead of
holding the request that made it: a report is answered, a committed change is answered.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings


def send_to_group(group: str, message: dict) -> None:
    """Raises what the channel layer raised, or TimeoutError past CHANNEL_SEND_TIMEOUT_S."""
    async_to_sync(_send)(group, message, settings.CHANNEL_SEND_TIMEOUT_S)


async def _send(group: str, message: dict, timeout_s: float) -> None:
    await asyncio.wait_for(get_channel_layer().group_send(group, message), timeout_s)
