"""Refuse an HTTP body larger than its endpoint allows before Django reads it.

Django's ASGI handler reads the whole body into a temporary file before any view (or
its authentication) runs, so the size limit has to be enforced in front of it: a
``Content-Length`` over the limit is answered 413 at once, and a body without one
(chunked) is counted as it arrives and cut off at the limit. Upload endpoints allow
their file's limit (``MAX_UPLOAD_BYTES``, ``JOB_MAX_INPUT_BYTES``, ``DATASET_MAX_BYTES``)
plus the multipart framing; every other path allows Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (nothing else takes files).

A request that declares both a ``Content-Length`` and a ``Transfer-Encoding`` is refused
400 before anything: the console's h11 reads such a body as chunked, so the declared
length (which the limit and the uploader check read) would not be the body's, and an
anonymous client declaring 10 bytes could spool an upload's worth (RFC 9112 §6.3 lets a
server refuse it, and asks it to close the connection).

An upload endpoint's limit is only for those who may upload. Django spools the whole
body to a temporary file before any view authenticates, so an anonymous 1 GB POST to an
upload URL used to take 1 GB of disk before its 401. Here a body larger than the default
limit is read only when the request's own credentials (an API token, or a session
cookie) name an active operator or admin; anyone else is answered 401 or 403 before a
byte of it is read.

Nor is the default limit for anyone: a request whose credentials name no one (no API
token, no signed-in session, no worker token) may carry ``ANONYMOUS_BODY_BYTES``. The
sign-in form is a few hundred bytes, and Django holds a body of up to 2.5 MB in memory:
300 unfinished 2.6 MB bodies to ``/login/`` took the console from 376 to 962 MB.

And a body has a deadline, as Apache's ``mod_reqtimeout`` (``body=20,MinRate=500``)
gives one: ``CONSOLE_CLIENT_WAIT_S`` from the first read, one more second for every
``BODY_MIN_RATE`` bytes received. A client past it is answered 408 and its connection closed; one that sent 1
byte every 10 s used to hold its connection and its part of a body for ever. (The
request head's deadline is ``console.http_protocol``'s.)
"""

from __future__ import annotations

import asyncio
import io
import json
from http.cookies import CookieError, SimpleCookie
from importlib import import_module

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import Resolver404, resolve
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from console import outage
from console.asgi_headers import header
from console.trailing_slash import SAFE_METHODS, slash_words
from registry.actions import uploads
from registry.api.permissions import carries_worker_token
from registry.artifacts.upload_handler import MULTIPART_OVERHEAD_BYTES, csrf_failure_from_headers
from registry.db_unavailable import is_database_unavailable
from registry.domain.roles import can_operate

# The endpoints that take files, and the setting that limits each one's file.
UPLOAD_LIMITS = {
    "api-versions": "MAX_UPLOAD_BYTES",
    "model-upload": "MAX_UPLOAD_BYTES",
    "api-jobs": "JOB_MAX_INPUT_BYTES",
    "model-jobs-new": "JOB_MAX_INPUT_BYTES",
    "api-datasets": "DATASET_MAX_BYTES",
    "model-datasets-new": "DATASET_MAX_BYTES",
}
UPLOAD_URL_NAMES = frozenset(UPLOAD_LIMITS)
# The last word of those endpoints' URLs that end with a slash (an upload sent without it is redirected).
UPLOAD_URL_ENDINGS = frozenset({"versions", "upload", "jobs", "datasets"})
ANONYMOUS_BODY_BYTES = 64 * 1024
ANONYMOUS_REFUSAL = (f"a request without a sign-in or a token may carry at most {ANONYMOUS_BODY_BYTES} bytes: "
                     "sign in or send an API token; the body was not read")
UNKNOWN_CREDENTIAL_REFUSAL = ("the Authorization header names no one: the token is unknown, revoked or its user inactive; "
                              "the body was not read")
BODY_MIN_RATE = 500  # bytes a second


def body_timed_out_words() -> str:
    return (f"the request body arrived slower than {BODY_MIN_RATE} bytes a second after its first {settings.CONSOLE_CLIENT_WAIT_S:g} "
            "seconds (CONSOLE_CLIENT_WAIT_S); the connection is closed")


def body_limit_for(path: str) -> int | None:
    """The most bytes a request body to ``path`` may have; None for no limit."""
    limit_setting = _upload_limit_setting(path)
    if limit_setting is not None:
        return getattr(settings, limit_setting) + MULTIPART_OVERHEAD_BYTES
    return default_body_limit()


def default_body_limit() -> int | None:
    if settings.DATA_UPLOAD_MAX_MEMORY_SIZE is None:
        return None
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE + MULTIPART_OVERHEAD_BYTES


def _upload_limit_setting(path: str) -> str | None:
    try:
        return UPLOAD_LIMITS.get(resolve(path).url_name)
    except Resolver404:
        return None


def uploader_refusal(headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
    """None when the request's own credentials name someone who may upload (an active
    operator or admin); else the status and words of the refusal. Reads the database."""
    user = _token_user(headers) or _session_user(headers)
    if user is None:
        return 401, "uploading needs an operator's sign-in or API token; the body was not read"
    if not can_operate(user):
        return 403, "your role may only read: operators and admins upload; the body was not read"
    return None


def carries_credentials(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the request's own credentials name someone: the worker token, an API
    token's active user, or a signed-in session. Reads the database for the last two."""
    authorization = header(headers, b"authorization") or ""
    return carries_worker_token(authorization.encode("latin-1")) or _token_user(headers) is not None or _session_user(headers) is not None


def _token_user(headers):
    """The user of an API token, checked as DRF checks it for the view (exists, user active)."""
    words = (header(headers, b"authorization") or "").split()
    if len(words) != 2 or words[0].lower() != TokenAuthentication.keyword.lower():
        return None
    try:
        return TokenAuthentication().authenticate_credentials(words[1])[0]
    except AuthenticationFailed:
        return None


def _session_user(headers):
    try:
        cookie = SimpleCookie(header(headers, b"cookie") or "").get(settings.SESSION_COOKIE_NAME)
    except CookieError:
        return None
    if cookie is None:
        return None
    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(cookie.value)
    user = get_user(request)  # checks the session's password hash, as Django's own middleware does
    return user if user.is_authenticated else None


def _may_exceed(scope, declared: int | None, limit: int) -> bool:
    """Whether the body may be larger than ``limit``: declared so, or chunked (no length)."""
    if declared is not None:
        return declared > limit
    return header(scope.get("headers", []), b"transfer-encoding") is not None


FRAMING_REFUSAL = ("a request may not carry both Content-Length and Transfer-Encoding (RFC 9112 section 6.3): "
                   "send one of them; the body was not read")


def _has_conflicting_framing(scope) -> bool:
    headers = scope.get("headers", [])
    return header(headers, b"transfer-encoding") is not None and header(headers, b"content-length") is not None


# Django's multipart parser reads a body of the length declared, and of none without one:
# a chunked upload was answered "No file was submitted", naming the wrong problem.
CHUNKED_UPLOAD_REFUSAL = ("an upload needs a Content-Length header: a chunked (Transfer-Encoding) multipart body cannot be read; "
                          "the body was not read")


def _is_chunked_upload(scope) -> bool:
    headers = scope.get("headers", [])
    return (scope.get("method") == "POST" and _upload_limit_setting(scope["path"]) is not None
            and header(headers, b"transfer-encoding") is not None and _declared_length(scope) is None)


def _declared_length(scope) -> int | None:
    try:
        return int(header(scope.get("headers", []), b"content-length"))
    except (TypeError, ValueError):  # no header, or not a number
        return None


async def _refuse(send, scope, limit: int, refusal: tuple[int, str] | None = None) -> None:
    status, words = refusal or (413, too_large_words(scope["path"], limit))
    await send_refusal(send, status, words, scope)


def too_large_words(path: str, limit: int) -> str:
    """The 413's words, naming the setting to raise: the bare byte count (the setting plus
    the framing) matched no setting an operator could find."""
    setting = _upload_limit_setting(path)
    if setting is not None and limit == getattr(settings, setting) + MULTIPART_OVERHEAD_BYTES:
        return (f"the request body is larger than the limit of {limit} bytes: {setting} ({getattr(settings, setting)}) "
                f"plus {MULTIPART_OVERHEAD_BYTES} bytes of multipart framing")
    return f"the request body is larger than the limit of {limit} bytes for any request but an operator's upload"


VERSION_UPLOADS = frozenset({"api-versions", "model-upload"})


def record_upload_too_large(scope) -> None:
    """A version upload refused for its declared length is recorded, as the view records
    its own 413s, when it is known to be an operator's: by an API token, or by a session
    whose X-CSRFToken header passes Django's check (the page's script sends one). A plain
    form's token lies in the unread body, and another site's forged form must not write an
    operator's name into the audit."""
    match = resolve(scope["path"])
    if match.url_name not in VERSION_UPLOADS:
        return
    headers = scope.get("headers", [])
    user = _token_user(headers) or _session_user_past_csrf(scope)
    if user is not None and can_operate(user):
        uploads.record_too_large(match.kwargs.get("name", ""), user)


def _session_user_past_csrf(scope):
    user = _session_user(scope.get("headers", []))
    if user is None or header(scope.get("headers", []), b"x-csrftoken") is None:
        return None
    request = ASGIRequest(scope, io.BytesIO())  # headers and cookies only: the body stays unread
    return user if csrf_failure_from_headers(request) is None else None


REFUSAL_HEADINGS = {400: "The request was malformed", 401: "Sign in first", 403: "Your role may not do this",
                    408: "What you sent arrived too slowly", 411: "The upload had no length", 413: "What you sent is too large",
                    503: "The database is unavailable", 507: "The console's disk is full"}


def _is_page_form(scope) -> bool:
    """A browser's plain form post (not the API, not a page script's fetch, which reads JSON)."""
    accept = header(scope.get("headers", []), b"accept") or ""
    return not scope["path"].startswith("/api/") and "text/html" in accept and "application/json" not in accept


async def send_refusal(send, status: int, words: str, scope=None) -> None:
    """A JSON ``{"error": words}`` answer sent before Django (or instead of it), closing the
    connection: the body was not read, or not all of it. A browser's form post to a page
    gets the words in the console's error page instead (its user saw raw JSON), rendered
    without the database like every error page."""
    if scope is not None and _is_page_form(scope):
        context = {"status": status, "heading": REFUSAL_HEADINGS.get(status, "The request was refused"), "words": words}
        body, content_type = render_to_string("refused.html", context).encode(), b"text/html; charset=utf-8"
    else:
        # A page's script reads a page's answers as {"level", "message"}: the try-it form's
        # 413 showed "No answer." (a tired operator's 3 MB paste). The API's shape stays.
        page_shape = {} if scope is None or scope["path"].startswith("/api/") else {"level": "error", "message": words}
        body, content_type = json.dumps({"error": words, **page_shape}).encode(), b"application/json"
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    if status == 401:
        headers.append((b"www-authenticate", b"Token"))
    elif status == 503:
        headers.append((b"retry-after", str(outage.RETRY_AFTER_S).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _upload_without_its_slash(scope) -> str | None:
    """The upload URL ``scope``'s path names but for its trailing slash: an operator's 3 MB
    upload there was refused 413 as "not an upload", where a small one got its 308."""
    path = scope["path"]
    # Resolved only for a path ending as an upload URL does (a worker's report every second paid two resolves).
    if path.endswith("/") or path.rsplit("/", 1)[-1] not in UPLOAD_URL_ENDINGS or _upload_limit_setting(path + "/") is None:
        return None
    return path + "/" + (f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else "")


async def _send_to_the_slash(send, scope, location: str) -> None:
    """The 308 (a POST's method and body are kept when followed) sent before the body is read."""
    body = json.dumps({"error": slash_words(scope.get("method", "POST"), scope["path"], location)}).encode()
    status = 301 if scope.get("method") in SAFE_METHODS else 308
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"location", location.encode("latin-1")), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def caller_limit(scope, declared: int | None, limit: int) -> tuple[int, tuple[int, str] | None]:
    """The most bytes this caller's body may have, and the refusal past it (None: the plain
    413). An upload's limit is an operator's, the default anyone's who signed in, and
    ``ANONYMOUS_BODY_BYTES`` the rest's. Reads the database only for a body that may be
    larger than the caller's credentials would allow."""
    headers = scope.get("headers", [])
    default = default_body_limit()
    if default is not None and limit > default and _may_exceed(scope, declared, default):
        refusal = uploader_refusal(headers)
        if refusal is None:
            return limit, None
        anonymous = refusal[0] == 401 and not carries_worker_token((header(headers, b"authorization") or "").encode("latin-1"))
        return (ANONYMOUS_BODY_BYTES if anonymous else default), refusal
    if limit > ANONYMOUS_BODY_BYTES and _may_exceed(scope, declared, ANONYMOUS_BODY_BYTES) and not carries_credentials(headers):
        if _upload_limit_setting(scope["path"]) is not None:
            return ANONYMOUS_BODY_BYTES, uploader_refusal(headers)  # the 401 that says who may upload
        if header(headers, b"authorization") is not None:
            # A revoked or mistyped token: a 413 about the body sent its client after the wrong problem.
            return ANONYMOUS_BODY_BYTES, (401, UNKNOWN_CREDENTIAL_REFUSAL)
        return ANONYMOUS_BODY_BYTES, (413, ANONYMOUS_REFUSAL)
    return limit, None


def _needs_credentials(scope, declared: int | None, limit: int) -> bool:
    return limit > ANONYMOUS_BODY_BYTES and _may_exceed(scope, declared, ANONYMOUS_BODY_BYTES)


class BodyDeadline:
    """``CONSOLE_CLIENT_WAIT_S`` from the first read, and a second more for every ``BODY_MIN_RATE`` bytes."""

    def __init__(self, started: float):
        self.started = started
        self.wait_s = settings.CONSOLE_CLIENT_WAIT_S

    def seconds_left(self, now: float, received: int) -> float:
        return self.started + self.wait_s + received / BODY_MIN_RATE - now


class BodySizeLimit:
    """ASGI middleware: the limit from ``body_limit_for`` and ``caller_limit``, before and
    while reading, and the body's deadline."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if _has_conflicting_framing(scope):
            return await send_refusal(send, 400, FRAMING_REFUSAL, scope)
        if location := _upload_without_its_slash(scope):
            return await _send_to_the_slash(send, scope, location)
        limit = body_limit_for(scope["path"])
        declared = _declared_length(scope)
        refusal = None
        if limit is not None and _needs_credentials(scope, declared, limit):
            try:
                limit, refusal = await database_sync_to_async(caller_limit)(scope, declared, limit)
            except Exception as error:
                if not is_database_unavailable(error):
                    raise
                return await _refuse(send, scope, limit, (503, outage.MESSAGE))
        if limit is not None and declared is not None and declared > limit:
            if refusal is None and _upload_limit_setting(scope["path"]) is not None:  # an upload, over its file's limit
                try:
                    await database_sync_to_async(record_upload_too_large)(scope)
                except Exception as error:
                    if not is_database_unavailable(error):
                        raise
                    return await _refuse(send, scope, limit, (503, outage.MESSAGE))
            return await _refuse(send, scope, limit, refusal)
        if limit is not None and refusal is None and declared is None and _is_chunked_upload(scope):
            return await _refuse(send, scope, limit, (411, CHUNKED_UPLOAD_REFUSAL))
        await self.app(scope, _LimitedBody(scope, receive, send, limit, refusal).receive, send)


class _LimitedBody:
    """A request's ``receive``: the body counted against its limit and its deadline; the
    refusal sent once, and Django told the client went (it then answers nothing)."""

    def __init__(self, scope, receive, send, limit: int | None, refusal):
        self.scope, self._receive, self._send = scope, receive, send
        self.limit, self.refusal = limit, refusal
        self.received = 0
        self.deadline: BodyDeadline | None = None
        self.body_done = False
        self.refused = False

    async def receive(self):
        if self.refused:
            return {"type": "http.disconnect"}  # Django stops reading and answers nothing
        if self.body_done:  # Django's wait for a disconnect while it answers has no deadline
            return await self._receive()
        loop = asyncio.get_running_loop()
        if self.deadline is None:
            self.deadline = BodyDeadline(loop.time())
        try:
            message = await asyncio.wait_for(self._receive(), self.deadline.seconds_left(loop.time(), self.received))
        except TimeoutError:
            return await self._refuse(408, body_timed_out_words())
        if message["type"] != "http.request":
            return message
        self.received += len(message.get("body", b""))
        self.body_done = not message.get("more_body", False)
        if self.limit is not None and self.received > self.limit:
            return await self._refuse(*(self.refusal or (413, too_large_words(self.scope["path"], self.limit))))
        return message

    async def _refuse(self, status: int, words: str):
        if not self.refused:
            self.refused = True
            await send_refusal(self._send, status, words, self.scope)
        return {"type": "http.disconnect"}
