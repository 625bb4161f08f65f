"""REST API for a model's traffic over a past range, per version, with its release
markers: what the console's charts start from (registry.fleet.series)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.api.errors import error_response, error_responses
from registry.api.lookups import get_model
from registry.fleet import series

RANGE_PARAMETER = OpenApiParameter("range", str, enum=list(series.RANGES), default="15m",
                                   description="15m: 5-second buckets from the report samples; 1h, 6h, 24h: per minute from the roll-ups.")
MAX_VERSION = 2**31 - 1  # a PositiveIntegerField on every database
VERSION_PARAMETER = OpenApiParameter("version", {"type": "integer", "minimum": 1, "maximum": MAX_VERSION}, required=False,
                                     description="Only this version's figures (markers stay the model's).")


class ModelSeries(APIView):
    @extend_schema(
        parameters=[RANGE_PARAMETER, VERSION_PARAMETER],
        responses={200: OpenApiTypes.OBJECT, **error_responses(400, 404)},
        description=(
            "{model, range, step_s, start, end, t: [bucket start, Unix s], versions: [{version, requests_per_s, ok_per_s, "
            "client_errors_per_s, errors_per_s, error_rate, client_error_rate, p50_ms, p99_ms, queue_depth}], markers: "
            "[{t, generation, action, label, routes}]}: every figure list is aligned with t, null where the version has "
            "no figures; error_rate (5xx) and client_error_rate (4xx) are shares of requests; queue_depth only at 15m."
        ),
    )
    def get(self, request, name: str):
        model = get_model(name)
        try:
            span = series.parse_range(request.query_params.get("range"))
        except series.UnknownRange as refusal:
            return error_response(str(refusal), status.HTTP_400_BAD_REQUEST)
        raw_version = request.query_params.get("version")
        if raw_version is not None and not (raw_version.isascii() and raw_version.isdigit() and len(raw_version) <= 10 and 1 <= int(raw_version) <= MAX_VERSION):
            return error_response(f"version must be a version number; got {raw_version[:20]!r}", status.HTTP_400_BAD_REQUEST)
        version = int(raw_version) if raw_version is not None else None
        if version is not None and not model.versions.filter(number=version).exists():
            return error_response(f"{model.name} has no version {version}", status.HTTP_404_NOT_FOUND)
        return Response(series.model_series(model, span, version=version))
