"""REST API for a model's traffic: the current release and the actions that change it
(set routes, promote, rollback, restore), and the release history. The rules live in
``registry.actions.releases``."""

from __future__ import annotations

import datetime

from django.db import DatabaseError
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.actions import releases
from registry.api import pagination, serializers
from registry.api.errors import error_response, error_responses
from registry.api.lookups import get_model
from registry.api.parsers import JSONParser
from registry.committed_change import committing, mark_committed
from registry.db_unavailable import is_database_unavailable
from registry.fleet import workers as fleet
from registry.models import RegisteredModel, Release


def release_body(model: RegisteredModel, release: Release | None) -> dict:
    body = {"model": model.name, "archived": model.is_archived, "release": None if release is None else serializers.ReleaseSerializer(release).data,
            "rollback_returns_to": releases.rollback_preview(release)}
    body.update(fleet.convergence(release))
    return body


def committed_release_body(model: RegisteredModel, release: Release) -> dict:
    """``release_body`` with what the change was told (a version evaluated worse than the
    stable), or, when the database fails after the commit, what the call knows without it:
    the change is made, and a 503 would have the client make it twice."""
    worse = {"evaluated_worse": release.evaluated_worse} if getattr(release, "evaluated_worse", None) else {}
    try:
        return release_body(model, release) | worse
    except DatabaseError as error:
        if not is_database_unavailable(error):
            raise
    warning = ("the database became unavailable right after this change was committed: workers' convergence and the "
               "rollback preview could not be read; GET this model's release once it answers")
    return {"model": model.name, "archived": model.is_archived, "release": serializers.ReleaseSerializer(release).data,
            "rollback_returns_to": None, "workers": [], "converged": False, "failing_elsewhere": 0, "rollback_ready": False,
            "warning": warning, **worse}


def release_at(model: RegisteredModel, raw: str) -> Response:
    """The release that was in force at ``raw`` (an ISO 8601 time): the newest made at or
    before it."""
    try:
        at = parse_datetime(raw.strip().replace(" ", "+")) if raw.strip() else None  # a "+" in a query string arrives as a space
    except ValueError:  # well formed but impossible: a 25-hour offset, February 30th
        at = None
    if at is None:
        return error_response(f"at must be an ISO 8601 time such as 2026-12-01T16:00:00Z, got {raw[:60]!r}", 400)
    if timezone.is_naive(at):
        at = at.replace(tzinfo=datetime.timezone.utc)  # a time without a zone is UTC, as the API's times are
    try:
        at = at.astimezone(datetime.timezone.utc)  # as the database compares it: year 1 at +01:00 overflowed there (a 500)
    except OverflowError:
        return error_response(f"at must be a time between the years 1 and 9999 in UTC, got {raw[:60]!r}", 400)
    release = model.releases.filter(created_at__lte=at).order_by("-generation").select_related("actor", "rollback_target").first()
    if release is None:
        return error_response(f"{model.name} had no release at {at.isoformat()}: its first was made later (or never)", 404)
    return Response({"model": model.name, "at": at.isoformat(), "release": serializers.ReleaseSerializer(release).data})


TRAFFIC_RESPONSES = {201: serializers.ReleaseStateSerializer, **error_responses(400, 404, 409, 415, conflict=serializers.GenerationConflictSerializer)}


class ReleaseAction(APIView):
    """Base for the POST actions: run one release function, answer the new state."""

    # JSON only: routes are a list of objects, which a form encoding cannot carry.
    parser_classes = [JSONParser]
    request_serializer = serializers.ReasonSerializer

    def act(self, model, data):
        raise NotImplementedError

    @extend_schema(request=serializers.ReasonSerializer, responses=TRAFFIC_RESPONSES)
    def post(self, request, name: str):
        model = get_model(name)
        form = self.request_serializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            with committing(request):
                release = self.act(model, form.validated_data)
        except releases.ReleaseError as error:
            return error_response(error.message, error.status, **error.details())
        mark_committed(request, f"{model.name}: generation {release.generation}")
        # The release this call made, not the model's newest: another change may have
        # committed since, and this answer describes this call's change.
        return Response(committed_release_body(model, release), status=status.HTTP_201_CREATED)


class CurrentRelease(ReleaseAction):
    request_serializer = serializers.SetRoutesSerializer

    @extend_schema(
        parameters=[OpenApiParameter("at", str, description="An ISO 8601 time: answer the release in force then (only `model`, `at`, `release`).")],
        responses={200: serializers.ReleaseStateSerializer, **error_responses(400, 404)},
    )
    def get(self, request, name: str):
        model = get_model(name)
        if "at" in request.query_params:
            return release_at(model, request.query_params["at"])
        return Response(release_body(model, model.current_release()))

    @extend_schema(request=serializers.SetRoutesSerializer, responses=TRAFFIC_RESPONSES)
    def post(self, request, name: str):
        return super().post(request, name)

    def act(self, model, data):
        return releases.set_routes(model, data["routes"], self.request.user, data["reason"], expected_generation=data.get("expected_generation"),
                                   force=data["force"])


class Promote(ReleaseAction):
    request_serializer = serializers.PromoteSerializer

    @extend_schema(request=serializers.PromoteSerializer, responses=TRAFFIC_RESPONSES)
    def post(self, request, name: str):
        return super().post(request, name)

    def act(self, model, data):
        return releases.promote(model, self.request.user, data["reason"], expected_generation=data.get("expected_generation"),
                                force=data["force"])


class Rollback(ReleaseAction):
    def act(self, model, data):
        return releases.rollback(model, self.request.user, data["reason"], expected_generation=data.get("expected_generation"))


class Restore(ReleaseAction):
    request_serializer = serializers.RestoreSerializer

    @extend_schema(request=serializers.RestoreSerializer, responses=TRAFFIC_RESPONSES)
    def post(self, request, name: str):
        return super().post(request, name)

    def act(self, model, data):
        return releases.restore(model, data["generation"], self.request.user, data["reason"], expected_generation=data.get("expected_generation"),
                                force=data["force"])


@extend_schema_view(get=extend_schema(
    parameters=pagination.PAGE_PARAMETERS, responses={200: serializers.ReleaseSerializer(many=True), **error_responses(400, 404)},
))
class ReleaseHistory(generics.ListAPIView):
    serializer_class = serializers.ReleaseSerializer
    pagination_class = pagination.ByGeneration

    def get_queryset(self):
        return get_model(self.kwargs["name"]).releases.select_related("actor", "rollback_target")
