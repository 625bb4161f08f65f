"""A websocket handshake during a database or Redis outage is refused cleanly, as HTTP's 503.

Channels' session and auth middleware read the session and the user from the database
before any consumer runs, so during an outage every browser's live feed, retried by each
open page, ended in an ASGI exception with a traceback and an HTTP 500 handshake. Here
an unavailable database before the socket is accepted refuses the handshake: a 503 with
``Retry-After`` where the server takes ASGI's denial response (uvicorn does), a plain
close (403) elsewhere; one warning line, no traceback. The same holds for the channel
layer's Redis, which a consumer joins groups on and reads from, whether it refuses or,
stopped, never answers (``bounded``); once a feed is open, a lost Redis closes it with
1013 ("try again later") and the page reconnects, a stopped one too: the feed's own ping
through the layer stops coming back (consumers.FEED_PING_EVERY_S).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from django.conf import settings
from redis.exceptions import RedisError

from console.outage import RETRY_AFTER_S
from registry.db_unavailable import is_database_unavailable

logger = logging.getLogger(__name__)

DENIAL_EXTENSION = "websocket.http.response"


class ChannelLayerTimeout(Exception):
    """The channel layer's Redis took the call and gave no answer within its bound."""


# What channels_redis raises when Redis refuses or drops a call, and what ``bounded``
# raises when it never answers one (the layer has no read timeout: see redis_options).
CHANNEL_LAYER_DOWN = (RedisError, ChannelLayerTimeout)


async def bounded(call):
    """Await one channel layer call for at most CHANNEL_SEND_TIMEOUT_S (registry.broadcast's
    bound). A Redis that accepts connections and never answers (a stopped process) held a
    handshake's group_add, and a close's group_discard, for as long as it stayed so: past
    the bound it is the outage it is, ChannelLayerTimeout."""
    try:
        return await asyncio.wait_for(call, settings.CHANNEL_SEND_TIMEOUT_S)
    except asyncio.TimeoutError as error:
        raise ChannelLayerTimeout(f"no answer within {settings.CHANNEL_SEND_TIMEOUT_S:g} s") from error


def is_outage(error: BaseException) -> bool:
    return is_database_unavailable(error) or isinstance(error, CHANNEL_LAYER_DOWN)


def database_error_in(error: BaseException | None) -> BaseException | None:
    """The unavailable database's (or Redis's) error that ``error`` was raised by or while
    handling (Channels' session wrapper trips over its own half-loaded session afterwards)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if is_outage(error):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class DatabaseOutageGuard:
    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        accepted = False

        async def watched_send(message):
            nonlocal accepted
            accepted = accepted or message["type"] in ("websocket.accept", "websocket.close", "websocket.http.response.start")
            await send(message)

        try:
            await self.inner(scope, receive, watched_send)
        except Exception as error:
            cause = database_error_in(error)
            if cause is None:
                raise
            what = "database" if is_database_unavailable(cause) else "channel layer"
            if not accepted:
                logger.warning("%s unavailable on websocket %s: handshake refused (%s)", what, scope.get("path", "")[:200],
                               type(cause).__name__)
                await refuse(scope, send, what)
            elif what == "channel layer":
                logger.warning("channel layer unavailable on websocket %s: closed (%s)", scope.get("path", "")[:200], type(cause).__name__)
                with contextlib.suppress(Exception):  # the client may have gone already
                    await send({"type": "websocket.close", "code": 1013})
            else:
                raise


async def refuse(scope, send, what: str = "database") -> None:
    if DENIAL_EXTENSION in scope.get("extensions", {}):
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"retry-after", str(RETRY_AFTER_S).encode())]
        await send({"type": "websocket.http.response.start", "status": 503, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": f"the {what} is unavailable; retry in {RETRY_AFTER_S} s".encode()})
    else:
        await send({"type": "websocket.close", "code": 1013})  # "try again later", for a server without denial responses
