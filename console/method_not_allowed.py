"""A page address visited with a method it does not take answers the console's error page.

Django's ``require_POST`` answers 405 with an empty body, which a browser shows as its own
error page (a tired operator typed ``/models/digits/split/`` and saw Chromium's). The
status and ``Allow`` stay; the API's 405s are DRF's JSON and are left as they are."""

from __future__ import annotations

from django.template.loader import render_to_string
from django.utils.deprecation import MiddlewareMixin


class MethodNotAllowedPage(MiddlewareMixin):
    def process_response(self, request, response):
        if response.status_code == 405 and not request.path.startswith("/api/") and not response.content:
            response.content = render_to_string("405.html", {"allowed": response.get("Allow", "")})
            response["Content-Type"] = "text/html; charset=utf-8"
            # CommonMiddleware, inside this one, has set it for the empty body: a server
            # refused to send more than it declared (an empty 405 and a traceback).
            response["Content-Length"] = str(len(response.content))
        return response
