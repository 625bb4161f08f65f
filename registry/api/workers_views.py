"""REST API for the serving workers the console knows, with their convergence; the rules
live in ``registry.fleet.workers``."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics

from registry.api import serializers
from registry.api.errors import error_responses
from registry.fleet import workers as fleet
from registry.fleet.state import current_generation
from registry.models import Worker


@extend_schema_view(get=extend_schema(responses={200: serializers.WorkerSerializer(many=True), **error_responses()}))
class Workers(generics.ListAPIView):
    serializer_class = serializers.WorkerSerializer

    def get_queryset(self):
        return fleet.live_workers() if self.request.query_params.get("all") != "1" else Worker.objects.all()

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "generation": current_generation(), "digests": fleet.IssuedDigests()}
