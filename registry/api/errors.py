"""One place that turns failures into JSON: ``{"error": "..."}`` (plus ``fields`` for
form errors). Never HTML, never a stack trace."""

from __future__ import annotations

import logging
import uuid

from django.http import JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

logger = logging.getLogger(__name__)


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # Django's handler500 answers, as JSON, below.
    if isinstance(exc, exceptions.ValidationError):
        response.data = {"error": _first_message(exc.detail), "fields": exc.detail}
    elif isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        response.data = {"error": str(exc.detail)}
        response.status_code = status.HTTP_401_UNAUTHORIZED
    else:
        response.data = {"error": str(exc.detail) if hasattr(exc, "detail") else str(exc)}
    return response


def error_response(message: str, status_code: int, **extra) -> Response:
    return Response({"error": message, **extra}, status=status_code)


def _first_message(detail) -> str:
    if isinstance(detail, dict):
        for field, value in detail.items():
            label = "" if field == "non_field_errors" else f"{field}: "
            return label + _first_message(value)
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    return str(detail)


def json_not_found(request, exception=None):
    return JsonResponse({"error": f"no such resource: {request.path}"}, status=404)


def json_server_error(request):
    request_id = uuid.uuid4().hex
    logger.error("internal error on %s %s (request %s)", request.method, request.path, request_id)
    return JsonResponse({"error": "internal error", "request_id": request_id}, status=500)
