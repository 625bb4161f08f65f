"""REST API for a model's audit timeline."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics

from registry.api import serializers
from registry.api.errors import error_responses
from registry.api.lookups import get_model
from registry.models import AuditEvent


@extend_schema_view(get=extend_schema(responses={200: serializers.AuditEventSerializer(many=True), **error_responses(404)}))
class Audit(generics.ListAPIView):
    serializer_class = serializers.AuditEventSerializer

    def get_queryset(self):
        return AuditEvent.objects.filter(model=get_model(self.kwargs["name"])).select_related("actor")
