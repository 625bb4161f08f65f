"""A multipart form is read as UTF-8 only, as Django reads an urlencoded one: another
charset is a 400, before anything reads its fields.

Django refuses an ``application/x-www-form-urlencoded`` body in another charset, but
decodes a ``multipart/form-data`` one's fields by the charset its Content-Type names. Under
``utf-7`` a data set's description sent as ``+ADw-script+AD4-`` was stored as
``<script>``, and under ``unicode_escape`` the bytes ``\\u202e`` became U+202E: a proxy or
a filter in front that reads the bytes saw other text than the console stored (an
attacker's review, 7 Dec). The API's JSON parser refuses such charsets too
(registry/api/parsers.py). Browsers send UTF-8 and name no charset here.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import BadRequest
from django.utils.decorators import sync_and_async_middleware
from django.utils.http import parse_header_parameters

from registry.api.parsers import read_as_utf8


@sync_and_async_middleware
def refuse_form_charsets(get_response):
    """Both kinds, so an ASGI request takes no thread hop here. The BadRequest is answered
    by handler400 (console.views.bad_request): the API's JSON, or the console's page."""
    if iscoroutinefunction(get_response):
        async def middleware(request):
            check(request)
            return await get_response(request)
    else:
        def middleware(request):
            check(request)
            return get_response(request)
    return middleware


def check(request) -> None:
    kind, parameters = parse_header_parameters(request.META.get("CONTENT_TYPE", ""))
    charset = parameters.get("charset")
    if kind == "multipart/form-data" and charset is not None and not read_as_utf8(charset):
        raise BadRequest(f"HTTP requests with the 'multipart/form-data' content type must be UTF-8 encoded, not charset={charset[:40]}.")
