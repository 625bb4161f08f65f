"""Readiness (``/readyz``): can this console do its work now? Liveness (``/healthz``)
only says the process answers, so an orchestrator restarts a hung console but not one
whose database is down, which a restart would not fix.

Each dependency is checked on a fresh connection of its own (a pooled one may look fine
or be broken for reasons a new client would not meet), both at once, and each check is
given ``CHECK_TIMEOUT_S``: a host that drops packets answers "no answer within …" instead
of holding the probe. Reasons name the kind of failure only; the details, which name
hosts, go to the log, since anyone who reaches the port may ask.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 2.0


class ReadOnlyDatabase(Exception):
    """The database answers but takes no writes (a hot standby, writes switched off)."""


def check_database() -> None:
    """``SELECT 1`` on a new connection, and on PostgreSQL that it takes writes; raises
    what the driver raised, or ReadOnlyDatabase."""
    connection = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
            if connection.vendor == "postgresql":
                cursor.execute("SHOW transaction_read_only")
                if cursor.fetchone()[0] == "on":
                    raise ReadOnlyDatabase("the database accepts no writes")
    finally:
        connection.close()


def check_redis() -> None:
    """PING on a new connection to ``REDIS_URL`` (channel layer and Celery broker).
    Without it the console uses neither (in-memory layer, eager tasks): nothing to check."""
    if not settings.REDIS_URL:
        return
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=CHECK_TIMEOUT_S, socket_timeout=CHECK_TIMEOUT_S)
    try:
        client.ping()
    finally:
        client.close()


CHECKS = {"database": (check_database, "cannot connect or query"), "redis": (check_redis, "cannot connect or ping")}


def readiness() -> dict:
    """``{"ready": bool, "database": {"ok": bool, "error"?: str}, "redis": {...}}``, within
    about ``CHECK_TIMEOUT_S`` whatever the dependencies do."""
    pool = ThreadPoolExecutor(max_workers=len(CHECKS), thread_name_prefix="readiness")
    try:
        futures = {name: pool.submit(check) for name, (check, _) in CHECKS.items()}
        wait(futures.values(), timeout=CHECK_TIMEOUT_S)
        results = {name: _result(name, future) for name, future in futures.items()}
    finally:
        pool.shutdown(wait=False)  # a check past its time ends on its driver's own timeout
    return {"ready": all(result["ok"] for result in results.values()), **results}


_flight_lock = threading.Lock()
_flight: Future | None = None  # the check running now, whose answer concurrent callers share


def shared_readiness() -> dict:
    """``readiness()``, one check at a time per process: a call made while a check runs
    waits for it (about ``CHECK_TIMEOUT_S`` at most) and answers what it found. Anyone may
    call ``/readyz``, and each check opens a connection to the database and to Redis: a
    flood of probes opened two for each."""
    global _flight
    with _flight_lock:
        flight, leads = (_flight, False) if _flight is not None else (Future(), True)
        if leads:
            _flight = flight
    if not leads:
        return flight.result()
    try:
        flight.set_result(readiness())
    except BaseException as error:
        flight.set_exception(error)
    finally:
        with _flight_lock:
            _flight = None
    return flight.result()


def _result(name: str, future) -> dict:
    if not future.done():
        logger.warning("readiness: %s gave no answer within %g s", name, CHECK_TIMEOUT_S)
        return {"ok": False, "error": f"no answer within {CHECK_TIMEOUT_S:g} s"}
    error = future.exception()
    if error is not None:  # any failure of the dependency is "not ready", never a 500
        logger.warning("readiness: %s failed: %s: %s", name, type(error).__name__, error)
        if isinstance(error, ReadOnlyDatabase):
            return {"ok": False, "error": "read-only: it accepts no writes"}
        return {"ok": False, "error": f"{CHECKS[name][1]} ({type(error).__name__})"}
    return {"ok": True}
