"""An API request names each query parameter once, separated the one way.

``?all=1&all=0`` took the last value (``QueryDict.get``) where a proxy, a cache key or an
access log may read the first: what was checked or recorded there and what the API did
would differ. No endpoint takes a list in its query, so a repeated parameter is a 400
naming it, before any view runs. So is a raw ``;``: Django reads ``all=1;all=0`` as one
parameter, some proxies and frameworks as two. Past Django's field limit the answer is
this JSON 400 too, not its HTML page.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import TooManyFieldsSent
from django.http import JsonResponse
from django.utils.decorators import sync_and_async_middleware

API_PREFIX = "/api/"
SHOWN_KEY_CHARS = 40


@sync_and_async_middleware
def refuse_repeated_query_parameters(get_response):
    """Both kinds, so an ASGI request takes no thread hop here (MiddlewareMixin's
    process_request runs in a thread under ASGI, on every request)."""
    if iscoroutinefunction(get_response):
        async def middleware(request):
            refusal = refusal_of(request)
            return refusal if refusal is not None else await get_response(request)
    else:
        def middleware(request):
            refusal = refusal_of(request)
            return refusal if refusal is not None else get_response(request)
    return middleware


def refusal_of(request) -> JsonResponse | None:
    """The 400 for an API request's query, or None."""
    if not request.path_info.startswith(API_PREFIX):  # path_info: the same under a SCRIPT_NAME prefix
        return None
    if ";" in request.META.get("QUERY_STRING", ""):
        return _refused("a ';' in the query string: separate parameters with '&' and write a ';' in a value as %3B")
    try:
        parameters = request.GET.lists()
    except TooManyFieldsSent as error:
        return _refused(str(error))
    for key, values in parameters:
        if len(values) > 1:
            return _refused(f"the query parameter '{key[:SHOWN_KEY_CHARS]}' is given {len(values)} times: send it once")
    return None


def _refused(error: str) -> JsonResponse:
    return JsonResponse({"error": error}, status=400)
