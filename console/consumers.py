"""The browser's live feed: worker figures relayed from ``registry.fleet.live``, and every
new desired state (the console's own ``serving`` broadcast) as a release change, so
pages re-render the split and convergence the moment an operator acts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from importlib import import_module

from channels.auth import get_user
from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings

from console.socket_outage import CHANNEL_LAYER_DOWN, bounded
from registry.actions import users
from registry.db_unavailable import is_database_unavailable
from registry.fleet.live import LIVE_GROUP
from registry.fleet.push_key import console_push_public_key
from serving.contract import SERVING_GROUP, ContractError, DesiredState
from serving.state_signing import SignatureRefused, model_digests, verify_push

logger = logging.getLogger(__name__)


class NoSuchSocket(AsyncWebsocketConsumer):
    """Any other websocket path: the handshake is refused (403). Without it Channels'
    router raised for the path, and every such handshake, anonymous ones too, logged an
    ERROR with a traceback quoting the path."""

    async def connect(self):
        await self.close()


# How often an open feed checks that its user is still signed in and active. The
# handshake alone let a user deactivated (or signed out elsewhere, or whose password
# changed) keep reading the feed for as long as the socket stayed open.
SIGN_IN_RECHECK_S = 5.0
CLOSE_SIGNED_OUT, CLOSE_TRY_AGAIN = 4401, 1013

# How often an open feed sends itself a ping through the channel layer. A Redis that stops
# answering after the feed opened (a stopped process: connections stay up, nothing moves)
# raised nothing: the feed stayed open and silent, and the page went on showing "Live"
# without polling. The layer's receive has no read timeout (console/redis_options.py says
# why), so the feed listens for its own ping instead: a send that times out, or no ping
# back for FEED_PINGS_MISSED intervals (the receive's connection hung alone), closes it
# with 1013 and the page polls and reconnects. One small message per interval per open feed,
# and its two groups joined again (see _watch_channel_layer).
FEED_PING_EVERY_S = 5.0
FEED_PINGS_MISSED = 2
FEED_PING = "live.ping"
WATCHDOG_TASK = "live-feed-watchdog"

# The feed only speaks; the page sends it nothing (static/js/console.js). A client's frame
# is dropped unread: AsyncJsonWebsocketConsumer decoded each one's JSON on the event loop,
# and two signed-in sockets sending 16 MiB arrays (uvicorn's default frame cap) held a
# light API request up to 7 s and grew the console by 250 MB. Dropped rather than closed
# with a policy code: the sender would reconnect, and a handshake (a session read) costs more.
# uvicorn refuses larger frames itself (--ws-max-size in console.processes.CONSOLE_HTTP_OPTIONS,
# closed with 1009); websocket pings are answered by uvicorn and never reach the consumer.
CLIENT_FRAME = "websocket.receive"


class FeedSlots:
    """Open live feeds of this process, by user: a handshake past LIVE_FEEDS_PER_USER for
    its user, or LIVE_FEEDS_MAX in all, is refused (1013; the page polls and tries again
    later). Every open feed is sent every worker report and state change: one viewer's
    2,000 feeds took a core of the console, grew it by 200 MB, and left the watchdog
    closing every other user's feed."""

    def __init__(self) -> None:
        self.by_user: dict[int, int] = {}

    @property
    def open(self) -> int:
        return sum(self.by_user.values())

    def take(self, user_id: int) -> str | None:
        """None when taken, else why not."""
        if self.by_user.get(user_id, 0) >= settings.LIVE_FEEDS_PER_USER:
            return f"this user has {settings.LIVE_FEEDS_PER_USER} live feeds open already (LIVE_FEEDS_PER_USER)"
        if self.open >= settings.LIVE_FEEDS_MAX:
            return f"{settings.LIVE_FEEDS_MAX} live feeds are open already (LIVE_FEEDS_MAX)"
        self.by_user[user_id] = self.by_user.get(user_id, 0) + 1
        return None

    def give_back(self, user_id: int) -> None:
        left = self.by_user.get(user_id, 0) - 1
        if left > 0:
            self.by_user[user_id] = left
        else:
            self.by_user.pop(user_id, None)


FEEDS = FeedSlots()  # the process's: its event loop is the one these feeds cost


def _say_if_it_died(task: asyncio.Task) -> None:
    """A watchdog ended by an error it does not expect leaves its feed unwatched: say so."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("live feed watchdog stopped: %r; this feed is no longer watched", task.exception())


class LiveConsumer(AsyncJsonWebsocketConsumer):
    _watchdog: asyncio.Task | None = None
    _closed = False  # set by close(): what arrives before the client's disconnect is dropped
    _slot_of: int | None = None  # the user whose feed slot this feed holds

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stop_watchdog()  # however the feed ended: disconnect, a handler's error, the server cancelling it
            if self._slot_of is not None:
                FEEDS.give_back(self._slot_of)
                self._slot_of = None

    async def connect(self):
        user = self.scope.get("user")
        # A one-time password opens only the password change (console/password_change.py),
        # not the feed: it streamed every worker's report before the password was chosen.
        if user is None or not user.is_authenticated or await database_sync_to_async(users.must_change_password)(user):
            await self.close(code=CLOSE_SIGNED_OUT)
            return
        refused = FEEDS.take(user.pk)
        if refused is not None:
            logger.warning("live feed refused, try again later: %s", refused)
            # Accepted first: a close before it is the handshake's HTTP 403, as a foreign
            # Origin's, and the page could not tell "too many" from "forbidden".
            await self.accept()
            await self.close(code=CLOSE_TRY_AGAIN, reason="too many live feeds open: try again later")
            return
        self._slot_of = user.pk
        self._checked_at = time.monotonic()
        # Redis down, or silent past the bound: the handshake is refused (1013) by socket_outage's guard.
        await bounded(self.channel_layer.group_add(LIVE_GROUP, self.channel_name))
        await bounded(self.channel_layer.group_add(SERVING_GROUP, self.channel_name))
        await self.accept()
        self._ping_back_at = time.monotonic()
        self._watchdog = asyncio.create_task(self._watch_channel_layer(), name=WATCHDOG_TASK)
        self._watchdog.add_done_callback(_say_if_it_died)

    async def dispatch(self, message):
        # A ping skips Channels' dispatch, which closes stale database connections on a
        # thread before every handler: a ping needs neither the thread nor the database.
        if message.get("type") == FEED_PING:
            self._ping_back_at = time.monotonic()
            return
        if message.get("type") == CLIENT_FRAME:
            return  # nothing the browser sends is read: see CLIENT_FRAME
        await super().dispatch(message)

    async def receive(self, text_data=None, bytes_data=None):
        """Never reached through dispatch (CLIENT_FRAME): whatever else calls it is not decoded either."""

    async def _watch_channel_layer(self):
        while True:
            await asyncio.sleep(FEED_PING_EVERY_S)
            if time.monotonic() - self._ping_back_at > FEED_PINGS_MISSED * FEED_PING_EVERY_S:
                # Its own ping not back: the layer's receive hung, or this feed's handlers
                # are stuck behind something slower (a database call): closed either way.
                cause = f"no ping came back through the channel layer in {FEED_PINGS_MISSED * FEED_PING_EVERY_S:g} s"
                break
            try:
                await bounded(self.channel_layer.send(self.channel_name, {"type": FEED_PING}))
                # Joined again: a Redis that lost its data (FLUSHALL, a failover to an empty
                # replica, an eviction) dropped the memberships and kept every connection, and
                # the feed's own pings still came back while no report or state reached it.
                await bounded(self.channel_layer.group_add(LIVE_GROUP, self.channel_name))
                await bounded(self.channel_layer.group_add(SERVING_GROUP, self.channel_name))
            except ChannelFull:
                pass  # the feed is far behind; if its pings stop coming back, the check above closes it
            except CHANNEL_LAYER_DOWN as error:
                cause = type(error).__name__
                break
        logger.warning("live feed on websocket %s closed, try again later: %s", self.scope.get("path", "")[:200], cause)
        with contextlib.suppress(Exception):  # the client may have gone already
            await self.close(code=CLOSE_TRY_AGAIN)

    def _stop_watchdog(self):
        if self._watchdog is not None:
            self._watchdog.cancel()

    async def close(self, code=None, reason=None):
        # A group message that arrives between our close and the client's disconnect was
        # sent after it: uvicorn raised "Unexpected ASGI message 'websocket.send', after
        # sending 'websocket.close'", a traceback per feed closed by the watchdog or a sign-out.
        if self._closed:
            return
        self._closed = True
        await super().close(code=code, reason=reason)

    async def send_json(self, content, close=False):
        if not self._closed and await self._still_signed_in():
            await super().send_json(content, close)

    async def _still_signed_in(self) -> bool:
        if time.monotonic() - self._checked_at < SIGN_IN_RECHECK_S:
            return True
        self._checked_at = time.monotonic()
        try:
            # The session's row read again (it may have been deleted), then its user: anonymous
            # once inactive or once its password changed, as Django's own middleware decides.
            self.scope["session"] = import_module(settings.SESSION_ENGINE).SessionStore(self.scope["session"].session_key)
            user = await get_user(self.scope)
        except Exception as error:
            if not is_database_unavailable(error):
                raise
            await self.close(code=CLOSE_TRY_AGAIN)  # the page reconnects, and its handshake answers 503
            return False
        if user.is_authenticated:
            return True
        await self.close(code=CLOSE_SIGNED_OUT)
        return False

    async def disconnect(self, code):
        self._stop_watchdog()  # before the discards, which may wait on a frozen Redis: no close during them
        try:
            await bounded(self.channel_layer.group_discard(LIVE_GROUP, self.channel_name))
            await bounded(self.channel_layer.group_discard(SERVING_GROUP, self.channel_name))
        except CHANNEL_LAYER_DOWN:
            pass  # the membership expires on its own (group_expiry)

    async def live_report(self, event):
        await self.send_json({key: value for key, value in event.items() if key != "type"} | {"kind": "report"})

    async def live_job(self, event):
        """A background job moved (registry.jobs.records.relay)."""
        await self.send_json({"kind": "job", "job": event.get("job")})

    async def serving_apply(self, event):
        """Channels' handler for contract.APPLY_MESSAGE ("serving.apply"). Anything that
        reaches Redis can publish to the group: only a state signed with the console's push
        key (as registry.fleet.publish signs every push) reaches a page, or a forged one
        would show operators routes, a generation and a digest nobody issued."""
        try:
            verify_push(event.get("state"), console_push_public_key())
            state = DesiredState.parse(event.get("state"))
        except (SignatureRefused, ContractError):
            return
        await self.send_json(state_change(state))


def state_change(state: DesiredState) -> dict:
    """Routes, generations and the digests of the state and of each model (a drill's
    progress counts the workers reporting either): browsers need no artifact URLs or
    signatures."""
    digests = model_digests(state)
    models = {
        name: {"generation": model.generation, "digest": digests[name],
               "routes": [{"version": route.version, "weight": route.weight} for route in model.routes]}
        for name, model in state.models.items()
    }
    return {"kind": "state", "generation": state.generation, "digest": state.digest, "models": models}
