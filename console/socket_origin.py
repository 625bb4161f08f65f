"""The live feed opens only from a page of the console itself: the websocket's Origin
must be the console's own origin (scheme, host and port, as the browser reached it) or
one of CSRF_TRUSTED_ORIGINS, the rule Django's CSRF check applies to a form.

Channels' AllowedHostsOriginValidator compares the Origin's host with ALLOWED_HOSTS and
ignores port and scheme: any other web application on the same host (Grafana, a
notebook, a dev server on :3000) counts as the same site for the session cookie
(SameSite=Lax), so a page there could open the feed as the signed-in user and read it."""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings

from console.asgi_headers import header

DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_key(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is not a number
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or DEFAULT_PORTS[parts.scheme]


def _own_scheme(scope) -> str:
    """http or https, as the browser reached the console (a TLS proxy's header when trusted)."""
    proxy_header = settings.SECURE_PROXY_SSL_HEADER  # ("HTTP_X_FORWARDED_PROTO", "https") when trusted
    if proxy_header:
        name = proxy_header[0].removeprefix("HTTP_").lower().replace("_", "-").encode()
        if header(scope.get("headers", []), name) == proxy_header[1]:
            return "https"
    return "https" if scope.get("scheme") == "wss" else "http"


def is_same_origin(scope) -> bool:
    headers = scope.get("headers", [])
    origin, host = header(headers, b"origin"), header(headers, b"host")
    if not origin or not host:
        return False
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    wanted = _origin_key(f"{_own_scheme(scope)}://{host}")
    return wanted is not None and _origin_key(origin) == wanted


class SameOriginValidator:
    """ASGI middleware for websockets: a handshake from another origin is denied (403)."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not is_same_origin(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
