"""Refuse an HTTP body larger than its endpoint allows before Django reads it.

Django's ASGI handler reads the whole body into a temporary file before any view (or
its authentication) runs, so the size limit has to be enforced in front of it: a
``Content-Length`` over the limit is answered 413 at once, and a body without one
(chunked) is counted as it arrives and cut off at the limit. Upload endpoints allow
their file's limit (``MAX_UPLOAD_BYTES``, ``JOB_MAX_INPUT_BYTES``, ``DATASET_MAX_BYTES``)
plus the multipart framing; every other path allows Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (nothing else takes files).
"""

from __future__ import annotations

import json

from django.conf import settings
from django.urls import Resolver404, resolve

from registry.artifacts.upload_handler import MULTIPART_OVERHEAD_BYTES

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


def body_limit_for(path: str) -> int | None:
    """The most bytes a request body to ``path`` may have; None for no limit."""
    try:
        limit_setting = UPLOAD_LIMITS.get(resolve(path).url_name)
    except Resolver404:
        limit_setting = None
    if limit_setting is not None:
        return getattr(settings, limit_setting) + MULTIPART_OVERHEAD_BYTES
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
