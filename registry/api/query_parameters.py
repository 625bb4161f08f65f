"""An API request names each query parameter once.

``?all=1&all=0`` took the last value (``QueryDict.get``) where a proxy, a cache key or an
access log may read the first: what was checked or recorded there and what the API did
would differ. No endpoint takes a list in its query, so a repeated parameter is a 400
naming it, before any view runs.
"""

from __future__ import annotations

from django.http import JsonResponse
from django.utils.deprecation import MiddlewareMixin

API_PREFIX = "/api/"
SHOWN_KEY_CHARS = 40


class RepeatedQueryParameterMiddleware(MiddlewareMixin):
    """MiddlewareMixin keeps it async-capable: no thread hop per request under ASGI."""

    def process_request(self, request):
        if not request.path.startswith(API_PREFIX):
            return None
        for key, values in request.GET.lists():
            if len(values) > 1:
                return JsonResponse({"error": f"the query parameter {key[:SHOWN_KEY_CHARS]!r} is given {len(values)} times: send it once"},
                                    status=400)
        return None
