"""REST API for a model's audit timeline: filtered by kind and by person, as JSON or as
a CSV download (``?format=csv`` or ``Accept: text/csv``) streamed row by row."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from registry.api import serializers
from registry.api.errors import error_response, error_responses
from registry.api.lookups import get_model
from registry.api.pagination import PAGE_PARAMETERS, page_of, refuse_unknown_query
from registry.api.streams import database_stream
from registry.domain import audit_log
from registry.domain.choices import AuditKind

FILTERS = [
    OpenApiParameter("kind", str, enum=AuditKind.values, description="Only events of this kind."),
    OpenApiParameter("actor", str, description="Only events by this user name (an unknown name is a 400)."),
    OpenApiParameter("format", str, enum=["json", "csv"], description="`csv`: a download with a header row, one row per event."),
]


class CsvRenderer(BaseRenderer):
    """Makes ``csv`` a format content negotiation accepts; the view streams the body itself."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        raise NotImplementedError("the audit view streams its CSV body")


class Audit(APIView):
    renderer_classes = [*api_settings.DEFAULT_RENDERER_CLASSES, CsvRenderer]

    @extend_schema(
        parameters=[*FILTERS, *PAGE_PARAMETERS],
        responses={200: serializers.AuditEventSerializer(many=True),
                   (200, "text/csv"): OpenApiResponse(str, description="time, kind, actor, generation, rollout, reason, message"),
                   **error_responses(400, 404)},
        description=("The model's audit events, newest first, a page at a time (JSON; the CSV is every event). "
                     "A bad `kind`, `actor`, `limit` or `cursor` is a 400 that names the parameter."),
    )
    def get(self, request, name: str):
        model = get_model(name)
        as_csv = request.accepted_renderer.format == CsvRenderer.format
        if as_csv:  # every event: a page's parameters would be ignored (page_of refuses the JSON's unknown ones)
            refuse_unknown_query(request, FILTERS, paged=False)
        try:
            chosen = audit_log.AuditFilter.parse(request.query_params)
        except audit_log.AuditFilterError as error:
            return error_response(error.message, status.HTTP_400_BAD_REQUEST, parameter=error.parameter)
        found = audit_log.events(model, chosen)
        if as_csv:
            return database_stream(request, csv_download(found, f"{model.name}-audit.csv"))
        page, pages = page_of(request, found, filters=FILTERS)
        return pages.get_paginated_response(serializers.AuditEventSerializer(page, many=True).data)

    def finalize_response(self, request, response, *args, **kwargs):
        # Only the events stream as CSV; a refusal or OPTIONS' metadata is JSON even when
        # the request asked for CSV.
        if isinstance(response, Response) and isinstance(getattr(request, "accepted_renderer", None), CsvRenderer):
            request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


def csv_download(found, filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(audit_log.stream(found), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "no-store"
    return response
