"""The worker's end of the channel layer: channels_redis, taking only what is addressed to
the one channel the worker receives on, and of bounded size.

channels_redis keeps a message read from a worker's Redis key for whichever local channel
the message names (``__asgi_channel__``), in a buffer of up to 100 messages per name
that nothing here ever reads: anything that could write to Redis filled a worker's
memory with messages naming made-up channels, or none (1.4 GB in 150 messages of 4 MB,
never freed), and one that was not msgpack made the worker drop its channel and join
again. Here a message read from the worker's key is taken only when it is a msgpack map
of at most ``MAX_MESSAGE_BYTES`` addressed to the worker's channel; anything else is
dropped as soon as it is read, counted, and logged at most once a minute. What is taken
is still only a push, which the worker applies only when the console signed it
(serving/control.py)."""

from __future__ import annotations

import logging
import time

import msgpack
from channels_redis.core import RedisChannelLayer

from serving.logs import event

logger = logging.getLogger("serving.control")

# A push carries one desired state, about a kilobyte a model: room for a thousand or more.
# Decoding costs up to some 60 bytes of objects per byte (a map of a million empty arrays
# is a million objects), on the serving loop: 8 MiB took it 3 s and 610 MB. A larger
# state is not lost: the push is dropped (and logged) and the worker takes the state from
# the console at its next reconcile, every few seconds.
MAX_MESSAGE_BYTES = 2 * 1024 * 1024
MAX_CONTAINER_ITEMS = 100_000  # of any one msgpack array or map
DROPPED_LOG_EVERY_S = 60.0


class Unreadable(dict):
    """What an unreadable message deserialises to: addressed to no channel."""


class WorkerChannelLayer(RedisChannelLayer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.own_channel: str | None = None
        self.dropped = 0
        self._dropped_since_log = 0
        self._logged_at = -DROPPED_LOG_EVERY_S

    async def new_channel(self, prefix: str = "specific") -> str:
        self.own_channel = await super().new_channel(prefix)
        return self.own_channel

    def deserialize(self, message: bytes) -> dict:
        if len(message) > MAX_MESSAGE_BYTES:
            return self._unreadable(f"{len(message)} bytes, over {MAX_MESSAGE_BYTES}")
        try:
            value = self._unpack(message)
        except Exception as error:  # msgpack's errors have no common base: any failure to read is the same refusal
            return self._unreadable(f"not a msgpack map ({type(error).__name__})")
        if not isinstance(value, dict):
            return self._unreadable(f"a msgpack {type(value).__name__}, not a map")
        return value

    def _unpack(self, message: bytes):
        serializer = self._serializer
        if serializer.crypter is not None:  # not how the worker configures it; channels_redis's own way then
            return super().deserialize(message)
        return msgpack.unpackb(message[serializer.random_prefix_length:], raw=False, max_array_len=MAX_CONTAINER_ITEMS,
                               max_map_len=MAX_CONTAINER_ITEMS, max_str_len=MAX_MESSAGE_BYTES, max_bin_len=MAX_MESSAGE_BYTES)

    async def receive_single(self, channel: str):
        while True:
            addressed_to, message = await super().receive_single(channel)
            if addressed_to == self.own_channel or (isinstance(addressed_to, list) and self.own_channel in addressed_to):
                return self.own_channel, message
            if not isinstance(message, Unreadable):  # counted when it was read
                self._drop(f"addressed to another channel ({_shown(addressed_to)})")

    def _unreadable(self, why: str) -> dict:
        self._drop(why)
        return Unreadable(__asgi_channel__=None)

    def _drop(self, why: str) -> None:
        self.dropped += 1
        self._dropped_since_log += 1
        now = time.monotonic()
        if now - self._logged_at >= DROPPED_LOG_EVERY_S:
            logger.warning(event("channel_message_dropped", reason=why, dropped=self._dropped_since_log,
                                 note="read from this worker's Redis key, not a message for it; dropped"))
            self._logged_at, self._dropped_since_log = now, 0


def _shown(addressed_to: object) -> str:
    """The address a dropped message named, bounded: str() of a list of millions was built whole."""
    if isinstance(addressed_to, str):
        return repr(addressed_to[:80])
    return type(addressed_to).__name__
