"""REST API for the whole desired serving state (workers and staff)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.api.errors import error_responses
from registry.api.permissions import IsWorkerOrStaff, WorkerTokenAuthentication
from registry.state import desired_state


class ServingState(APIView):
    """The whole desired serving state, for workers (Bearer worker token) and staff."""

    authentication_classes = [WorkerTokenAuthentication, *APIView.authentication_classes]
    permission_classes = [IsWorkerOrStaff]

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **error_responses()}, description="The whole desired state (contract 1 in docs/architecture.md).")
    def get(self, request):
        return Response(desired_state())
