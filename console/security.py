"""The Content-Security-Policy middleware, with the live feed's websocket origin.

The policy itself is ``CONTENT_SECURITY_POLICY`` in settings: nothing inline, every
script and style from this origin. Browsers that predate CSP Level 3 do not let
``'self'`` cover ``ws:``/``wss:``, so the page's own host is added to ``connect-src``
here, per request (the host is the one Django validated against ``ALLOWED_HOSTS``).
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware, PolicyParts
from django.core.exceptions import DisallowedHost


class LiveFeedCSPMiddleware(CSPMiddleware):
    def get_policy_parts(self, request, response, report_only: bool = False) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        try:
            host = request.get_host()
        except DisallowedHost:
            return parts  # answered 400 anyway; the settings' policy still applies
        update = dict(parts.update or {})
        update["connect-src"] = [*update.get("connect-src", []), f"ws://{host}", f"wss://{host}"]
        parts.update = update
        return parts
