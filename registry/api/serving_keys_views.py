"""`GET /api/serving/api-keys`: the active inference keys' sha256, for workers only."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.actions import api_keys
from registry.api.permissions import IsWorker, WorkerTokenAuthentication


class ServingApiKeys(APIView):
    authentication_classes = [WorkerTokenAuthentication, *APIView.authentication_classes]
    permission_classes = [IsWorker]

    @extend_schema(
        responses={
            200: inline_serializer("ApiKeyDigests", {"sha256": serializers.ListField(child=serializers.CharField())}),
            401: OpenApiResponse(description="no or a wrong worker token"),
            403: OpenApiResponse(description="a user, not a worker"),
        },
        description="The sha256 of every active inference API key; workers refresh it periodically.",
    )
    def get(self, request):
        return Response({"sha256": api_keys.active_digests()})
