"""Refuse an HTTP body larger than its endpoint allows before Django reads it.

Django's ASGI handler reads the whole body into a temporary file before any view (or
its authentication) runs, so the size limit has to be enforced in front of it: a
``Content-Length`` over the limit is answered 413 at once, and a body without one
(chunked) is counted as it arrives and cut off at the limit. Upload endpoints allow
``MAX_UPLOAD_BYTES`` plus the multipart framing; every other path allows Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (nothing else takes files).
"""

from __future__ import annotations

import json

from django.conf import settings
from django.urls import Resolver404, resolve

from registry.artifacts.upload_handler import MULTIPART_OVERHEAD_BYTES

UPLOAD_URL_NAMES = frozenset({"api-versions", "model-upload", "model-jobs-new", "model-datasets-new"})


def body_limit_for(path: str) -> int | None:
    """The most bytes a request body to ``path`` may have; None for no limit."""
    try:
        is_upload = resolve(path).url_name in UPLOAD_URL_NAMES
    except Resolver404:
        is_upload = False
    if is_upload:
        return settings.MAX_UPLOAD_BYTES + MULTIPART_OVERHEAD_BYTES
    if settings.DATA_UPLOAD_MAX_MEMORY_SIZE is None:
        return None
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE + MULTIPART_OVERHEAD_BYTES


def _declared_length(scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send, limit: int) -> None:
    body = json.dumps({"error": f"the request body is larger than the limit of {limit} bytes"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    """ASGI middleware: the limit from ``body_limit_for``, before and while reading."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        limit = body_limit_for(scope["path"]) if scope["type"] == "http" else None
        if limit is None:
            return await self.app(scope, receive, send)
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            return await _refuse(send, limit)
        received = 0
        refused = False

        async def counting_receive():
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if not refused:
                        refused = True
                        await _refuse(send, limit)
                    return {"type": "http.disconnect"}  # Django stops reading and answers nothing
            return message

        await self.app(scope, counting_receive, send)
