"""How the console's Channels layer and Celery broker talk to Redis, bounded in time.

A Redis that takes connections and never answers (a stopped process, a host out of
memory) held every request that publishes, with its thread and its database connection,
for as long as it stayed so. Both connect within CONNECT_TIMEOUT_S; the broker's reads
wait at most READ_TIMEOUT_S. The Channels layer has no read timeout: with one, a live
feed's blocking receive, cancelled when its socket closed, could hang the event loop's
shutdown (seen in the test suite); a request's send to a group is bounded by the caller
instead (registry/broadcast.py)."""

from __future__ import annotations

CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 10.0


def channel_layers(redis_url: str, prefix: str) -> dict:
    host = {"address": redis_url, "socket_connect_timeout": CONNECT_TIMEOUT_S}
    return {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                        "CONFIG": {"hosts": [host], "capacity": 1000, "expiry": 30, "prefix": prefix}}}


def broker_transport_options(prefix: str) -> dict:
    # The same prefix keeps the Celery queues of deployments sharing one Redis apart:
    # without it one deployment's workers would take the other's jobs (and find no such job).
    return {"global_keyprefix": f"{prefix}:", "socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": READ_TIMEOUT_S}
