"""The highest generation this console has issued under each epoch, kept in Redis.

``fleet.workers.renew_epoch_past`` must tell a database restored to a backup from a
worker-token holder reporting past the counter. The database cannot: a restore takes its
rows back with it. A console process's memory cannot either: a restore is followed by a
restart, and console processes are several. Redis outlives both, and every console
process and restart shares it: a generation issued above the counter now means the
database went back.

Written when a state is published or answered (once per new generation per process),
read only by a report past the counter. Without Redis (unset, or not answering) nothing
is known, and the caller treats that as "issued higher": a restore missed is worse than
an epoch renewed once too often.

The mark carries an HMAC of its epoch and generation keyed from the console's secret: a
worker's environment holds the Redis password, and with it and the worker token an
attacker set the mark past every report and renewed the epoch at each one (131 epochs
in 25 s; no release converged, every drill failed). A mark that does not prove itself
is unknown.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

TIMEOUT_S = 0.5
RETRY_AFTER_S = 5.0
_failed_at = -RETRY_AFTER_S
MARK_KEY_CONTEXT = b"modelops-issued-mark-v1"
# SET the value ("generation:mac") only when its generation is higher than the one held:
# one round trip, and two consoles never lower it. A value of another shape is overwritten.
RAISE = ("local held = tonumber(string.match(redis.call('GET', KEYS[1]) or '', '^(%d+):') or '-1'); "
         "if tonumber(ARGV[1]) > held then redis.call('SET', KEYS[1], ARGV[2]) end")
_noted: dict[str, int] = {}  # epoch -> the highest this process wrote: one write per new generation


def note_issued(epoch: str, generation: int) -> None:
    """Remember that ``generation`` of ``epoch`` was issued; a failure is logged, not raised,
    and the next try waits RETRY_AFTER_S: the state is answered on every worker's reconcile,
    and a Redis that never answers would hold each answer TIMEOUT_S."""
    global _failed_at
    if not settings.REDIS_URL or _noted.get(epoch, -1) >= generation or time.monotonic() - _failed_at < RETRY_AFTER_S:
        return
    try:
        with _client() as client:
            client.eval(RAISE, 1, _key(epoch), generation, _value(epoch, generation))
    except redis.RedisError as error:
        _failed_at = time.monotonic()
        logger.warning("could not note generation %s as issued in Redis (%s: %s)", generation, type(error).__name__, str(error)[:200])
        return
    if len(_noted) > 8:
        _noted.clear()
    _noted[epoch] = generation


def highest_issued(epoch: str) -> int | None:
    """The highest generation of ``epoch`` any console process noted; None when unknown
    (no Redis, no answer, nothing noted under this epoch yet, or a value that is no number)."""
    if not settings.REDIS_URL:
        return None
    try:
        with _client() as client:
            value = client.get(_key(epoch))
    except redis.RedisError as error:
        logger.warning("could not read the highest issued generation from Redis (%s: %s)", type(error).__name__, str(error)[:200])
        return None
    if value is None:
        return None
    generation, _, _ = value.decode("latin-1").partition(":")
    if not generation.isdigit() or not hmac.compare_digest(value, _value(epoch, int(generation)).encode()):
        # Not what note_issued writes: someone else with the Redis password wrote it.
        logger.warning("the highest issued generation of epoch %s in Redis was not written by this console: %r", epoch, value[:40])
        return None
    return int(generation)


def _value(epoch: str, generation: int) -> str:
    key = hmac.new(settings.SECRET_KEY.encode(), MARK_KEY_CONTEXT, hashlib.sha256).digest()
    return f"{generation}:{hmac.new(key, f'{epoch}:{generation}'.encode(), hashlib.sha256).hexdigest()}"


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S)


def _key(epoch: str) -> str:
    return f"{settings.CHANNEL_LAYER_PREFIX}:issued:{epoch}"
