"""ASGI entry point: Django for HTTP, Channels for the browsers' live-feed websockets
(workers speak HTTP to the console and hear it over the channel layer, not a websocket)."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django.setup(set_prefix=False)  # what django.core.asgi.get_asgi_application does, for our handler

from console.handler import ConsoleASGIHandler  # noqa: E402  (needs the app registry)

django_application = ConsoleASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the app registry)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from console.body_limit import BodySizeLimit  # noqa: E402
from console.socket_origin import SameOriginValidator  # noqa: E402
from console.socket_outage import DatabaseOutageGuard  # noqa: E402
from console.websocket_urls import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Oversized bodies are refused before Django spools them to disk; then so many
        # requests run at once, per kind (console/request_slots.py, in the handler).
        "http": BodySizeLimit(django_application),
        # A page of another origin cannot open the live feed with a signed-in user's
        # cookies: the Origin's host must be one of ALLOWED_HOSTS, and the Origin the
        # console's own (scheme and port too; console/socket_origin.py). The session and
        # user are read from the database before a consumer runs: an outage there refuses the handshake.
        "websocket": AllowedHostsOriginValidator(SameOriginValidator(DatabaseOutageGuard(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))))),
    }
)
