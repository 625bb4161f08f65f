"""REST API for rollouts: start one on a model, list and read them, pause, resume and
abort. The rules live in ``registry.actions.rollouts``."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.actions import releases, rollouts
from registry.api import pagination, serializers
from registry.api.errors import error_response, error_responses
from registry.api.lookups import get_model
from registry.api.parsers import JSONParser
from registry.committed_change import mark_committed

DEFAULT_STEPS = [1, 10, 50, 100]
DEFAULT_STEP_DURATION_S = 300


def _rollouts_of(name: str):
    return get_model(name).rollouts.select_related("model", "actor")


@extend_schema_view(get=extend_schema(
    parameters=pagination.PAGE_PARAMETERS, responses={200: serializers.RolloutSerializer(many=True), **error_responses(400, 404)},
))
class Rollouts(generics.ListAPIView):
    serializer_class = serializers.RolloutSerializer
    pagination_class = pagination.Pages
    parser_classes = [JSONParser]

    def get_queryset(self):
        return _rollouts_of(self.kwargs["name"])

    @extend_schema(
        request=serializers.RolloutStartSerializer,
        responses={201: serializers.RolloutDetailSerializer, **error_responses(400, 404, 409, 415, conflict=serializers.GenerationConflictSerializer)},
        description="Start a rollout: the canary gets the first step's weight at once; the analysis judges every `interval_s`.",
    )
    def post(self, request, name: str):
        model = get_model(name)
        form = serializers.RolloutStartSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        try:
            rollout = rollouts.start(
                model, data["canary_version"], data.get("steps", DEFAULT_STEPS), data.get("step_duration_s", DEFAULT_STEP_DURATION_S),
                data["analysis"], request.user, data["reason"], expected_generation=data.get("expected_generation"), force=data["force"],
                shadow_fraction=data.get("shadow_fraction", 1.0),
            )
        except releases.ReleaseError as error:
            return error_response(error.message, error.status, **error.details())
        mark_committed(request, f"{model.name}: rollout {rollout.pk} started (generation {rollout.release_generation})")
        return Response(serializers.RolloutDetailSerializer(rollout).data, status=status.HTTP_201_CREATED)


@extend_schema_view(get=extend_schema(responses={200: serializers.RolloutDetailSerializer, **error_responses(404)}))
class RolloutDetail(generics.RetrieveAPIView):
    serializer_class = serializers.RolloutDetailSerializer

    def get_object(self):
        return get_object_or_404(_rollouts_of(self.kwargs["name"]), pk=self.kwargs["pk"])


class RolloutAction(APIView):
    """Base for pause, resume and abort: one rollout function, the new state answered."""

    parser_classes = [JSONParser]
    rollout_action = None

    @extend_schema(request=serializers.ReasonSerializer, responses={200: serializers.RolloutDetailSerializer, **error_responses(400, 404, 409, 415)})
    def post(self, request, name: str, pk: int):
        rollout = get_object_or_404(_rollouts_of(name), pk=pk)
        form = serializers.ReasonSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            rollout = type(self).rollout_action(rollout, request.user, form.validated_data["reason"],
                                                expected_generation=form.validated_data.get("expected_generation"))
        except releases.ReleaseError as error:
            return error_response(error.message, error.status, **error.details())
        return Response(serializers.RolloutDetailSerializer(rollout).data)


class PauseRollout(RolloutAction):
    rollout_action = staticmethod(rollouts.pause)


class ResumeRollout(RolloutAction):
    rollout_action = staticmethod(rollouts.resume)


class AbortRollout(RolloutAction):
    """Stable back to 100 % at once."""

    rollout_action = staticmethod(rollouts.abort)
