"""How many HTTP requests one console process runs at once: ``CONSOLE_MAX_REQUESTS`` of
each kind; the rest wait, first come first served, ``CONSOLE_REQUEST_WAIT_S`` at most for
a slot, then are a 503.

Under ASGI, Django runs every request in a thread of its own with a database connection of
its own, and nothing bounded how many: 30 traffic changes waiting on a lock another
session held took 30 connections (110 in a fault run used up PostgreSQL's
``max_connections``, and every page, report and Celery task of every process on that
database failed with them). Here a process runs at most five times ``CONSOLE_MAX_REQUESTS``.

Each kind has its own slots, so one piling up does not stop the others:

- ``workers``: calls carrying the worker token (reports and acks keep a worker from being
  marked gone, artifact downloads start its versions; the token is checked here, without
  the database, so anyone else's request to ``/api/serving/`` is a read or a change like
  any other);
- ``probes``: ``/readyz`` (anyone may call it, and each call checks the database and
  Redis on new connections: a flood of it took the reads' slots; concurrent calls share
  one check, ``console.readiness.shared_readiness``);
- ``sign-in``: posts to the sign-in pages, the console's and the admin's (each a password
  hash, a fifth of a second of CPU, and anyone may send them);
- ``changes``: any other method but GET, HEAD and OPTIONS (what a held lock stalls);
- ``reads``: the rest;
- ``streams``: a streamed answer that reads the database while it is sent (the audit
  CSV, a page of events at a time: ``registry.api.streams.database_stream``), while its
  client keeps up (``console.stream_slot``). A stream waits for these as long as it takes
  (its answer has begun) and holds none, nor a connection, while its client reads slowly:
  16 slow readers of a long export held the 16 slots for as long as they cared to, and
  every other export waited 5 s and was refused. Every other answer is sent with no slot and no connection: the
  request's connection is closed before its slot is given back (Django closed it once
  the last byte was sent, so a slow reader kept one open).

A request takes its slot once its body has arrived (``console.handler``), so a client
sending slowly holds none, and waits in the event loop, holding no thread and no
connection. A flood makes the others wait their turn, as it made them slow before; none
is refused before it has waited. ``/healthz`` (liveness, no database) never waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import NamedTuple

from django.http import HttpResponse, JsonResponse
from django.template.loader import render_to_string

from console.outage import RETRY_AFTER_S as OUTAGE_RETRY_AFTER_S
from registry.api.permissions import carries_worker_token

EXEMPT_PATHS = frozenset({"/healthz"})
PROBE_PATHS = frozenset({"/readyz"})
SIGN_IN_PATHS = frozenset({"/login/", "/admin/login/"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
KINDS = ("workers", "sign-in", "changes", "reads", "streams", "probes")
RETRY_AFTER_S = 2
# What the security middleware adds to every other answer; the page needs only its stylesheet.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def request_kind(method: str, path: str, authorization: bytes | None) -> str | None:
    """Which slots a request takes; None: it takes none."""
    if path in EXEMPT_PATHS:
        return None
    if path in PROBE_PATHS:
        return "probes"
    if authorization and carries_worker_token(authorization):
        return "workers"
    if method in SAFE_METHODS:
        return "reads"
    return "sign-in" if path in SIGN_IN_PATHS else "changes"


class Refusal(NamedTuple):
    kind: str
    limit: int


class RequestSlots:
    """At most ``limit`` requests of each kind at once, each waiting ``wait_s`` at most."""

    def __init__(self, *, limit: int, wait_s: float):
        self.limit = limit
        self.wait_s = wait_s
        self.semaphores = {kind: asyncio.Semaphore(limit) for kind in KINDS}

    async def take(self, kind: str, *, patient: bool = False) -> Refusal | None:
        """A slot of ``kind`` (give it back with ``give_back``); the refusal when none came in
        time. ``patient``: waits as long as it takes, never refused."""
        semaphore = self.semaphores[kind]
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returned the slot and
            # dropped the cancellation when the client left as the slot came, so requests
            # nobody waited for ran on (16 audit exports for minutes after a storm of hang-ups).
            async with asyncio.timeout(self.wait_s if semaphore.locked() and not patient else None):
                await semaphore.acquire()
        except TimeoutError:
            return Refusal(kind, self.limit)
        if asyncio.current_task().cancelling():  # a guard: cancelled as the slot came, it is not this request's
            semaphore.release()
            raise asyncio.CancelledError
        return None

    def give_back(self, kind: str) -> None:
        self.semaphores[kind].release()

    @asynccontextmanager
    async def held(self, kind: str | None) -> AsyncIterator[Refusal | None]:
        """A slot of ``kind`` (None: none is needed) held for the block; yields None when the
        request may run, else why it may not (answer ``busy_response``)."""
        if kind is None:
            yield None
            return
        refusal = await self.take(kind)
        if refusal is not None:
            yield refusal
            return
        try:
            yield None
        finally:
            self.give_back(kind)


def busy_message(refusal: Refusal, database_unavailable: bool = False) -> str:
    if database_unavailable:
        return (f"the database is unavailable: {refusal.limit} requests of this kind ({refusal.kind}) are waiting for it in "
                f"this process (CONSOLE_MAX_REQUESTS) and none finished in time; nothing was done; retry in {OUTAGE_RETRY_AFTER_S} s")
    return (f"the console is busy: {refusal.limit} requests of this kind ({refusal.kind}) are running in this process "
            f"(CONSOLE_MAX_REQUESTS) and none finished in time; nothing was done; retry in {RETRY_AFTER_S} s")


def busy_response(path: str, accept: str, refusal: Refusal, database_unavailable: bool = False) -> HttpResponse:
    """The 503: JSON for the API and for the pages' scripts (which ask for JSON), a page
    elsewhere (rendered without a request: no session, no user, no database, as every
    error page). ``database_unavailable``: the last request of this process that needed
    the database could not reach it, so the slots are most likely held by requests
    waiting for it, and the answer says so rather than "busy" (an operator facing an
    outage looks at the database, not at the console's load)."""
    message = busy_message(refusal, database_unavailable)
    if path.startswith("/api/") or "application/json" in accept:
        response = JsonResponse({"error": message}, status=503)
    else:
        page = {"message": message, "database_unavailable": database_unavailable}
        response = HttpResponse(render_to_string("503_busy.html", page), status=503)
    response["Retry-After"] = str(OUTAGE_RETRY_AFTER_S if database_unavailable else RETRY_AFTER_S)
    response["Cache-Control"] = "no-store"
    # Sent without the middleware that adds these to every other answer.
    for header, value in PAGE_HEADERS.items():
        response[header] = value
    return response
