"""Multipart bodies that carry a file for a job or a data set: parsed only once the
caller is authenticated and allowed (the view calls ``parse`` from its ``post``), staged
into the store with the endpoint's own size limit, and whatever was staged but not
taken is removed when the request ends."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rest_framework import serializers, status
from rest_framework.response import Response

from registry.actions import received_files
from registry.api.errors import error_response
from registry.artifacts.upload_handler import declared_too_large, start_staging


class BodyTooLarge(Exception):
    pass


@contextlib.contextmanager
def staged_files(request, max_bytes: int) -> Iterator[None]:
    """File parts of this request's body are staged (up to ``max_bytes`` each) while
    the block runs; BodyTooLarge when the body is past the limit."""
    if declared_too_large(request._request, max_bytes):
        raise BodyTooLarge()
    staging = start_staging(request._request, max_bytes)
    try:
        yield
    finally:
        staging.discard()  # a file the action took has moved away already


def parse(request, form_class: type[serializers.Serializer]) -> serializers.Serializer:
    form = form_class(data=request.data)
    if getattr(request._request, "upload_too_large", False):
        raise BodyTooLarge()
    form.is_valid(raise_exception=True)
    return form


def too_large_response(max_bytes: int, limit_setting: str, what: str) -> Response:
    refusal = received_files.too_large(max_bytes, limit_setting, what)
    return error_response(refusal.reason, status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
