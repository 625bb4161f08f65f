"""REST API for the serving workers: the desired state they converge to, their acks of
applied states and their reports (everything under ``/api/serving/`` but the API keys,
``serving_keys_views``). The rules live in ``registry.fleet``."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers as drf_serializers
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.actions import worker_reports
from registry.api import serializers
from registry.api.errors import error_response, error_responses
from registry.api.parsers import JSONParser
from registry.api.permissions import (
    IsWorker,
    IsWorkerOrStaff,
    WorkerTokenAuthentication,
)
from registry.committed_change import committing
from registry.fleet import report_rate, worker_keys
from registry.fleet import workers as fleet
from registry.fleet.push_key import console_push_key_hex
from registry.fleet.state import desired_state
from serving.contract import MAX_LOADED, MAX_REPORTED_VERSIONS, MAX_WORKER_ID_CHARS, WORKER_KEY_HEADER
from serving.state_signing import PUSH_KEY_HEADER


class ServingState(APIView):
    """The whole desired serving state, for workers (Bearer worker token) and staff."""

    authentication_classes = [WorkerTokenAuthentication, *APIView.authentication_classes]
    permission_classes = [IsWorkerOrStaff]

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **error_responses()}, description="The whole desired state (contract 1 in docs/architecture.md).",
                   parameters=[OpenApiParameter(PUSH_KEY_HEADER, str, OpenApiParameter.HEADER, response=True,
                                                description="the console's public Ed25519 key that signs pushes (64 hex)")])
    def get(self, request):
        # The key workers check pushes with, from the one they trust to tell them the state.
        return Response(desired_state(), headers={PUSH_KEY_HEADER: console_push_key_hex()})


HEX64 = r"\A[0-9a-f]{64}\Z"  # \Z: "$" would let a trailing newline through


WORKER_KEY_PARAMETER = OpenApiParameter(
    WORKER_KEY_HEADER, str, OpenApiParameter.HEADER, required=False,
    description="The worker's own key: the first report with a key claims the worker id for it; later reports and acks "
                "under that id without it are refused (403)",
)


MAX_ACK_ERROR_CHARS = 2000


class AckSerializer(drf_serializers.Serializer):
    worker = serializers.StrictCharField(max_length=MAX_WORKER_ID_CHARS)
    generation = serializers.StrictIntegerField(min_value=0, max_value=serializers.GENERATION_MAX)
    digest = serializers.StrictRegexField(HEX64, trim_whitespace=False, help_text="sha256 of the state applied (64 lowercase hex)")
    ok = serializers.StrictBooleanField()
    error = serializers.StrictCharField(required=False, allow_blank=True, allow_null=True,
                                        help_text=f"why the state was not applied; kept to its first {MAX_ACK_ERROR_CHARS} characters")
    load_ms = serializers.StrictFloatField(required=False, default=0.0, min_value=0.0)
    epoch = serializers.StrictCharField(max_length=32, required=False, allow_null=True, allow_blank=True, default=None,
                                        help_text="the epoch of the state applied; another database's is refused")
    contract = serializers.StrictIntegerField(help_text="serving.contract's CONTRACT_VERSION; any other is refused")

    def validate_error(self, error: str | None) -> str | None:
        # Kept for every worker until it is forgotten and shown on every release answer:
        # 40 acks of 2.5 MB each grew the database by 201 MB in 5 s, /api/workers/ to 97 MB.
        if error is not None and len(error) > MAX_ACK_ERROR_CHARS:
            return error[:MAX_ACK_ERROR_CHARS] + "…"
        return error


class WorkerAcks(APIView):
    """Workers ack each desired-state generation they applied (or failed to)."""

    authentication_classes = [WorkerTokenAuthentication]
    permission_classes = [IsWorker]
    parser_classes = [JSONParser]

    @extend_schema(request=AckSerializer, parameters=[WORKER_KEY_PARAMETER], responses={204: None, **error_responses(400, 403, 415)})
    def post(self, request):
        try:
            fleet.check_contract(request.data)  # first: an ack of another version may have any shape
            form = AckSerializer(data=request.data)
            form.is_valid(raise_exception=True)
            fleet.record_ack(form.validated_data, request.headers.get(WORKER_KEY_HEADER))
        except worker_keys.KeyRefused as refusal:
            return error_response(str(refusal), status.HTTP_403_FORBIDDEN)
        except fleet.Refused as refusal:
            return error_response(str(refusal), status.HTTP_400_BAD_REQUEST)
        return Response(status=status.HTTP_204_NO_CONTENT)


class IdentitySerializer(drf_serializers.Serializer):
    id = serializers.StrictCharField(max_length=MAX_WORKER_ID_CHARS)
    host = serializers.StrictCharField(max_length=200, required=False, allow_blank=True)
    pid = serializers.StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=2**31 - 1)
    url = serializers.StrictCharField(max_length=300, required=False, allow_blank=True)
    device = serializers.StrictCharField(max_length=50, required=False, allow_blank=True)


class ReportSerializer(drf_serializers.Serializer):
    """The parts of a report the console relies on; the rest is kept as sent."""

    worker = IdentitySerializer()
    # null: a worker that has applied no state yet still reports, so the console lists it.
    generation = serializers.StrictIntegerField(min_value=0, max_value=serializers.GENERATION_MAX, required=False, allow_null=True, default=None)
    digest = serializers.StrictRegexField(HEX64, trim_whitespace=False, required=False, allow_null=True, default=None)
    epoch = serializers.StrictCharField(max_length=32, required=False, allow_null=True, allow_blank=True, default=None)
    # null: a worker before model digests, or past serving.contract.MAX_MODEL_DIGESTS models.
    models = drf_serializers.DictField(
        child=serializers.StrictRegexField(HEX64, trim_whitespace=False), required=False, allow_null=True, default=None,
        help_text="model name → sha256 of that model's entry as served (serving.state_signing.model_digests): proves each model "
                  "on a worker that serves a state but for another model; names are model names, at most 1,024")
    # Each entry is checked by serving.contract (a model name, a version): a DRF serializer
    # per entry cost 13 times the time of any other field of the same size.
    loaded = serializers.LengthFirstListField(child=drf_serializers.DictField(), required=False, default=list, max_length=MAX_LOADED,
                                  error_messages={"max_length": "must have at most {max_length} items"})
    versions = serializers.LengthFirstListField(child=drf_serializers.DictField(), required=False, default=list, max_length=MAX_REPORTED_VERSIONS,
                                    error_messages={"max_length": "must have at most {max_length} items"})
    contract = serializers.StrictIntegerField(help_text="serving.contract's CONTRACT_VERSION; any other is refused")

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

    @extend_schema(request=ReportSerializer, parameters=[WORKER_KEY_PARAMETER],
                   responses={204: None, **error_responses(400, 403, 415, 429)})
    def post(self, request):
        try:
            fleet.check_contract(request.data)  # first: a report of another version may have any shape
            form = ReportSerializer(data=request.data)
            form.is_valid(raise_exception=True)
            report = {**request.data, **form.validated_data}
            # A COMMIT that lost its connection may have kept the report, and its 503 says
            # "in_doubt" (console/outage.py), which the worker takes as kept.
            with committing(request):
                worker = worker_reports.take(report, request.headers.get(WORKER_KEY_HEADER))
        except worker_keys.KeyRefused as refusal:
            return error_response(str(refusal), status.HTTP_403_FORBIDDEN)
        except report_rate.TooSoon as refusal:
            response = error_response(str(refusal), status.HTTP_429_TOO_MANY_REQUESTS)
            response["Retry-After"] = report_rate.retry_after_header(refusal.retry_after_s)
            return response
        except fleet.Refused as refusal:
            return error_response(str(refusal), status.HTTP_400_BAD_REQUEST)
        worker_reports.after(worker)
        return Response(status=status.HTTP_204_NO_CONTENT)
