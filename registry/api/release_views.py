"""REST API for traffic, drills, workers and the audit timeline; rules live in
``registry.releases``, ``registry.drills`` and ``registry.fleet``."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers as drf_serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import drills, fleet, live, releases
from registry.api import serializers
from registry.api.errors import error_response, error_responses
from registry.api.permissions import IsWorker, WorkerTokenAuthentication
from registry.models import AuditEvent, Drill, RegisteredModel, Release, Worker
from registry.state import current_generation


def get_model(name: str) -> RegisteredModel:
    return get_object_or_404(RegisteredModel, name=name)


def release_body(model: RegisteredModel, release: Release | None) -> dict:
    body = {"model": model.name, "release": None if release is None else serializers.ReleaseSerializer(release).data}
    body.update(fleet.convergence(release))
    return body


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
            release = self.act(model, form.validated_data)
        except releases.ReleaseError as error:
            return error_response(error.message, error.status, **error.details())
        # The release this call made, not the model's newest: another change may have
        # committed since, and this answer describes this call's change.
        return Response(release_body(model, release), status=status.HTTP_201_CREATED)


class CurrentRelease(ReleaseAction):
    request_serializer = serializers.SetRoutesSerializer

    @extend_schema(responses={200: serializers.ReleaseStateSerializer, **error_responses(404)})
    def get(self, request, name: str):
        model = get_model(name)
        return Response(release_body(model, model.current_release()))

    @extend_schema(request=serializers.SetRoutesSerializer, responses=TRAFFIC_RESPONSES)
    def post(self, request, name: str):
        return super().post(request, name)

    def act(self, model, data):
        return releases.set_routes(model, data["routes"], self.request.user, data["reason"], expected_generation=data.get("expected_generation"))


class Promote(ReleaseAction):
    def act(self, model, data):
        return releases.promote(model, self.request.user, data["reason"], expected_generation=data.get("expected_generation"))


class Rollback(ReleaseAction):
    def act(self, model, data):
        return releases.rollback(model, self.request.user, data["reason"], expected_generation=data.get("expected_generation"))


class Restore(ReleaseAction):
    request_serializer = serializers.RestoreSerializer

    @extend_schema(request=serializers.RestoreSerializer, responses=TRAFFIC_RESPONSES)
    def post(self, request, name: str):
        return super().post(request, name)

    def act(self, model, data):
        return releases.restore(model, data["generation"], self.request.user, data["reason"], expected_generation=data.get("expected_generation"))


@extend_schema_view(get=extend_schema(responses={200: serializers.DrillSerializer(many=True), **error_responses(404)}))
class Drills(generics.ListAPIView):
    serializer_class = serializers.DrillSerializer
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
            drill = drills.run_drill(
                model, request.user, roll_forward=form.validated_data["roll_forward"], expected_generation=form.validated_data.get("expected_generation"),
            )
        except releases.ReleaseError as error:
            return error_response(error.message, error.status, **error.details())
        return Response(serializers.DrillSerializer(drill).data, status=status.HTTP_201_CREATED)


@extend_schema_view(get=extend_schema(responses={200: serializers.DrillSerializer(many=True), **error_responses()}))
class AllDrills(generics.ListAPIView):
    serializer_class = serializers.DrillSerializer
    queryset = Drill.objects.select_related("model", "actor")


@extend_schema_view(get=extend_schema(responses={200: serializers.AuditEventSerializer(many=True), **error_responses(404)}))
class Audit(generics.ListAPIView):
    serializer_class = serializers.AuditEventSerializer

    def get_queryset(self):
        return AuditEvent.objects.filter(model=get_model(self.kwargs["name"])).select_related("actor")


@extend_schema_view(get=extend_schema(responses={200: serializers.WorkerSerializer(many=True), **error_responses()}))
class Workers(generics.ListAPIView):
    serializer_class = serializers.WorkerSerializer

    def get_queryset(self):
        return fleet.live_workers() if self.request.query_params.get("all") != "1" else Worker.objects.all()

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "generation": current_generation(), "digests": fleet.IssuedDigests()}


HEX64 = r"\A[0-9a-f]{64}\Z"  # \Z: "$" would let a trailing newline through


class AckSerializer(drf_serializers.Serializer):
    worker = serializers.StrictCharField(max_length=100)
    generation = serializers.StrictIntegerField(min_value=0, max_value=serializers.GENERATION_MAX)
    digest = serializers.StrictRegexField(HEX64, trim_whitespace=False, help_text="sha256 of the state applied (64 lowercase hex)")
    ok = serializers.StrictBooleanField()
    error = serializers.StrictCharField(required=False, allow_blank=True, allow_null=True)
    load_ms = serializers.StrictFloatField(required=False, default=0.0)
    contract = serializers.StrictIntegerField(help_text="serving.contract's CONTRACT_VERSION; any other is refused")


class WorkerAcks(APIView):
    """Workers ack each desired-state generation they applied (or failed to)."""

    authentication_classes = [WorkerTokenAuthentication]
    permission_classes = [IsWorker]
    parser_classes = [JSONParser]

    @extend_schema(request=AckSerializer, responses={204: None, **error_responses(400, 415)})
    def post(self, request):
        try:
            fleet.check_contract(request.data)  # first: an ack of another version may have any shape
            form = AckSerializer(data=request.data)
            form.is_valid(raise_exception=True)
            fleet.record_ack(form.validated_data)
        except fleet.Refused as refusal:
            return error_response(str(refusal), status.HTTP_400_BAD_REQUEST)
        return Response(status=status.HTTP_204_NO_CONTENT)


class IdentitySerializer(drf_serializers.Serializer):
    id = serializers.StrictCharField(max_length=100)
    host = serializers.StrictCharField(max_length=200, required=False, allow_blank=True)
    pid = serializers.StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=2**31 - 1)
    url = serializers.StrictCharField(max_length=300, required=False, allow_blank=True)
    device = serializers.StrictCharField(max_length=50, required=False, allow_blank=True)


class LoadedSerializer(drf_serializers.Serializer):
    model = serializers.StrictCharField()
    version = serializers.StrictIntegerField(min_value=1)


class ReportSerializer(drf_serializers.Serializer):
    """The parts of a report the console relies on; the rest is kept as sent."""

    worker = IdentitySerializer()
    # null: a worker that has applied no state yet still reports, so the console lists it.
    generation = serializers.StrictIntegerField(min_value=0, max_value=serializers.GENERATION_MAX, required=False, allow_null=True, default=None)
    digest = serializers.StrictRegexField(HEX64, trim_whitespace=False, required=False, allow_null=True, default=None)
    epoch = serializers.StrictCharField(max_length=32, required=False, allow_null=True, allow_blank=True, default=None)
    loaded = drf_serializers.ListField(child=drf_serializers.DictField(), required=False, default=list)
    versions = drf_serializers.ListField(child=drf_serializers.DictField(), required=False, default=list)
    contract = serializers.StrictIntegerField(help_text="serving.contract's CONTRACT_VERSION; any other is refused")

    def validate_loaded(self, entries):
        for entry in entries:
            LoadedSerializer(data=entry).is_valid(raise_exception=True)
        return entries

    def validate(self, attrs):
        # The report is stored as sent, and PostgreSQL's JSON cannot hold a NUL character.
        if contains_nul(self.initial_data):
            raise drf_serializers.ValidationError("a report must not contain NUL (\\u0000) characters")
        return attrs


def contains_nul(value: object) -> bool:
    """Any NUL in the strings (keys included) of a parsed JSON value; iterative, since
    the nesting depth is the sender's."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


class WorkerReports(APIView):
    """Workers report about once a second; figures are relayed live to browsers."""

    authentication_classes = [WorkerTokenAuthentication]
    permission_classes = [IsWorker]
    parser_classes = [JSONParser]

    @extend_schema(request=ReportSerializer, responses={204: None, **error_responses(400, 415)})
    def post(self, request):
        try:
            fleet.check_contract(request.data)  # first: a report of another version may have any shape
            form = ReportSerializer(data=request.data)
            form.is_valid(raise_exception=True)
            report = {**request.data, **form.validated_data}
            worker = fleet.record_report(report)
        except fleet.Refused as refusal:
            return error_response(str(refusal), status.HTTP_400_BAD_REQUEST)
        live.ingest_report(worker, report)
        return Response(status=status.HTTP_204_NO_CONTENT)
