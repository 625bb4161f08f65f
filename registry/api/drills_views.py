"""REST API for rollback drills: run one on a model, list a model's or every model's.
The drill itself is ``registry.actions.drills``."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, status
from rest_framework.response import Response

from registry.actions import drills, releases
from registry.api import pagination, serializers
from registry.api.errors import error_response, error_responses
from registry.api.lookups import get_model
from registry.api.parsers import JSONParser
from registry.committed_change import committing, mark_committed
from registry.models import Drill


@extend_schema_view(get=extend_schema(
    parameters=pagination.PAGE_PARAMETERS, responses={200: serializers.DrillSerializer(many=True), **error_responses(400, 404)},
))
class Drills(generics.ListAPIView):
    serializer_class = serializers.DrillSerializer
    pagination_class = pagination.Pages
    parser_classes = [JSONParser]

    def get_queryset(self):
        return get_model(self.kwargs["name"]).drills.select_related("model", "actor")

    @extend_schema(
        request=serializers.DrillRequestSerializer,
        responses={201: serializers.DrillSerializer, **error_responses(400, 404, 409, 415, conflict=serializers.GenerationConflictSerializer)},
    )
    def post(self, request, name: str):
        model = get_model(name)
        form = serializers.DrillRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            # As a traffic action: an outage once the rollback is committed answers that it
            # was made (``made``), one during its COMMIT that it may have been (``committing``).
            with committing(request):
                drill = drills.run_drill(
                    model, request.user, roll_forward=form.validated_data["roll_forward"], expected_generation=form.validated_data.get("expected_generation"),
                    made=lambda change: mark_committed(request, change),
                )
        except releases.ReleaseError as error:
            return error_response(error.message, error.status, **error.details())
        mark_committed(request, f"{model.name}: drill {drill.pk} ran ({drill.status})")
        return Response(serializers.DrillSerializer(drill).data, status=status.HTTP_201_CREATED)


@extend_schema_view(get=extend_schema(
    parameters=pagination.PAGE_PARAMETERS, responses={200: serializers.DrillSerializer(many=True), **error_responses(400)},
))
class AllDrills(generics.ListAPIView):
    serializer_class = serializers.DrillSerializer
    pagination_class = pagination.Pages
    queryset = Drill.objects.select_related("model", "actor")
