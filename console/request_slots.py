"""How many HTTP requests one console process runs at once: ``CONSOLE_MAX_REQUESTS`` of
each kind, the rest wait ``CONSOLE_REQUEST_WAIT_S`` for a slot, then are a 503.

Under ASGI, Django runs every request in a thread of its own with a database connection of
its own, and nothing bounded how many: 30 traffic changes waiting on a lock another
session held took 30 connections (110 in a fault run used up PostgreSQL's
``max_connections``, and every page, report and Celery task of every process on that
database failed with them). Here a process runs at most three times ``CONSOLE_MAX_REQUESTS``.

Three kinds, each with its own slots, so one kind piling up does not stop the others:
workers' calls (``/api/serving/``: their reports keep them from being marked gone),
changes (any method but GET, HEAD and OPTIONS: they are what a held lock stalls) and
reads. A request takes its slot once its body has arrived (``console.body_spool``), so a
client sending slowly holds none; it waits in the event loop, holding no thread and no
connection. Past the wait, or when as many as ``QUEUE_PER_SLOT`` times the slots already
wait, it is answered 503 with ``Retry-After`` at once, naming the cause.

``/healthz`` (liveness, no database) never waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import NamedTuple

from django.http import HttpResponse, JsonResponse
from django.template.loader import render_to_string

EXEMPT_PATHS = frozenset({"/healthz"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
KINDS = ("workers", "changes", "reads")
# Waiting costs a coroutine, not a thread; past this many a request is refused at once,
# so a flood is answered in milliseconds instead of each caller waiting the full time.
QUEUE_PER_SLOT = 4
RETRY_AFTER_S = 2


def request_kind(method: str, path: str) -> str | None:
    """Which slots a request takes; None: it takes none."""
    if path in EXEMPT_PATHS:
        return None
    if path.startswith("/api/serving/"):
        return "workers"
    return "reads" if method in SAFE_METHODS else "changes"


class Refusal(NamedTuple):
    kind: str
    limit: int


class _Slots:
    """A kind's slots and the requests waiting for one."""

    def __init__(self, limit: int):
        self.limit = limit
        self.semaphore = asyncio.Semaphore(limit)
        self.waiting = 0

    async def take(self, wait_s: float) -> bool:
        if not self.semaphore.locked():  # a free slot and nobody before this request
            await self.semaphore.acquire()
            return True
        if self.waiting >= QUEUE_PER_SLOT * self.limit:
            return False
        self.waiting += 1
        try:
            await asyncio.wait_for(self.semaphore.acquire(), wait_s)
            return True
        except TimeoutError:
            return False
        finally:
            self.waiting -= 1


class RequestSlots:
    """At most ``limit`` requests of each kind at once, each waiting ``wait_s`` at most."""

    def __init__(self, *, limit: int, wait_s: float):
        self.wait_s = wait_s
        self.slots = {kind: _Slots(limit) for kind in KINDS}

    @asynccontextmanager
    async def held(self, method: str, path: str) -> AsyncIterator[Refusal | None]:
        """Holds a slot for the block; yields None when the request may run, else why it
        may not (answer ``busy_response``)."""
        kind = request_kind(method, path)
        if kind is None:
            yield None
            return
        slots = self.slots[kind]
        if not await slots.take(self.wait_s):
            yield Refusal(kind, slots.limit)
            return
        try:
            yield None
        finally:
            slots.semaphore.release()


def busy_message(kind: str, limit: int) -> str:
    return (f"the console is busy: {limit} requests of this kind ({kind}) are running in this process "
            f"(CONSOLE_MAX_REQUESTS) and none finished in time; nothing was done; retry in {RETRY_AFTER_S} s")


def busy_response(path: str, refusal: Refusal) -> HttpResponse:
    """The 503: JSON for the API, a page elsewhere (rendered without a request: no session,
    no user, no database, as every error page)."""
    message = busy_message(refusal.kind, refusal.limit)
    if path.startswith("/api/"):
        response = JsonResponse({"error": message}, status=503)
    else:
        response = HttpResponse(render_to_string("503_busy.html", {"message": message}), status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    response["Cache-Control"] = "no-store"
    return response
