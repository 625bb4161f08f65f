"""How the API's own authentication classes appear in its OpenAPI schema.

drf-spectacular knows DRF's classes; ours it left out with a warning, so the worker
endpoints showed no security at all and a client generated from the schema could not
know they take a bearer token. Imported by ``RegistryConfig.ready``, which registers them.
"""

from __future__ import annotations

from drf_spectacular.authentication import SessionScheme
from drf_spectacular.extensions import OpenApiAuthenticationExtension


class HeaderCsrfSessionScheme(SessionScheme):
    """The console's session cookie; unsafe methods also need the ``X-CSRFToken`` header."""

    target_class = "registry.api.versions_views.HeaderCsrfSessionAuthentication"
    name = "cookieAuthCsrfHeader"  # the same cookie as cookieAuth; its CSRF token only in the header

    def get_security_definition(self, auto_schema):
        return {**super().get_security_definition(auto_schema),
                "description": "The console's session cookie; a POST also needs the `X-CSRFToken` header (a form field is not read)."}


class WorkerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "registry.api.permissions.WorkerTokenAuthentication"
    name = "workerToken"

    def get_security_definition(self, auto_schema):
        # An apiKey in the Authorization header, as DRF's own tokenAuth is described: an
        # `http` bearer scheme would have clients (and schemathesis) take that header as
        # the only credential, where a staff session may read these endpoints too.
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "The serving workers' shared token (SERVING_WORKER_TOKEN), as `Authorization: Bearer <token>`."}
