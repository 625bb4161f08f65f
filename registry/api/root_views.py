"""``GET /api/``: where the API's collections and its schema are, as DRF's own API root
says; the README and `make run`'s banner point people here."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from registry.api.errors import error_responses

ENTRY_POINTS = {"models": "api-models", "workers": "api-workers", "drills": "api-all-drills", "schema": "api-schema"}


class ApiRoot(APIView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT, **error_responses()},
                   description="The API's collections and its OpenAPI schema, each by its absolute URL.")
    def get(self, request):
        return Response({name: reverse(route, request=request) for name, route in ENTRY_POINTS.items()})
