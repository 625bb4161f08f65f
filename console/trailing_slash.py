"""Django's APPEND_SLASH, keeping the request's method and saying what it did.

Django answers a path that lacks only its trailing slash with an empty 301. A client
re-sends a 301's POST as a GET (or, curl -L, without its body: a rollback lost its
reason), and a client that does not follow it sees nothing at all: a traffic change sent
to ``/api/models/digits/release`` looked done and was not. A change (POST, PUT, PATCH,
DELETE) is answered 308, which a client follows with the same method and body, and
the API's answers say in JSON that nothing was done at this URL and which one to use.
"""

from __future__ import annotations

import json

from django.http import HttpResponsePermanentRedirect
from django.http.response import HttpResponseRedirectBase
from django.middleware.common import CommonMiddleware
from django.utils.http import escape_leading_slashes

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class PermanentRedirectKeepingMethod(HttpResponseRedirectBase):
    status_code = 308


class AppendSlashMiddleware(CommonMiddleware):
    def get_full_path_with_slash(self, request):
        # Django refuses this in DEBUG for a POST, since its 301 would lose the body; a 308 keeps it.
        return escape_leading_slashes(request.get_full_path(force_append_slash=True))

    def process_response(self, request, response):
        if response.status_code == 404 and self.should_redirect_with_slash(request):
            return slash_redirect(request, self.get_full_path_with_slash(request))
        return super().process_response(request, response)


def slash_redirect(request, location: str):
    keeps_method = request.method not in SAFE_METHODS
    redirect = PermanentRedirectKeepingMethod if keeps_method else HttpResponsePermanentRedirect
    if not request.path.startswith("/api/"):
        return redirect(location)
    return redirect(location, content=json.dumps({"error": slash_words(request.method, request.path, location)}),
                    content_type="application/json")


def slash_words(method: str, path: str, location: str) -> str:
    if method not in SAFE_METHODS:
        return (f"{method} {path}: this endpoint's URL ends with a slash ({location}); nothing was done here. "
                "Send the request there (a client that follows redirects, such as curl -L, sends it again with the same method and body)")
    return f"{path} is at {location} (the URL ends with a slash)"
