"""One place that turns failures into JSON: ``{"error": "..."}`` (plus ``fields`` for
form errors). Never HTML, never a stack trace."""

from __future__ import annotations

import logging
import re
import uuid

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import JsonResponse
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, status
from rest_framework.permissions import SAFE_METHODS
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from registry.artifacts import storage

logger = logging.getLogger(__name__)
# A store that refuses writes is a mount or permissions fault someone must mend: ask again later.
STORE_RETRY_AFTER_S = 30


# Django's own limits on a request body, met while DRF parses it: Django would answer its
# HTML "Bad Request (400)" page, naming nothing.
BODY_LIMITS = {TooManyFieldsSent: status.HTTP_400_BAD_REQUEST, TooManyFilesSent: status.HTTP_400_BAD_REQUEST,
               RequestDataTooBig: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE}


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is None:
        limit = next((code for kind, code in BODY_LIMITS.items() if isinstance(exc, kind)), None)
        if limit is not None:  # e.g. "The number of GET/POST parameters exceeded settings.DATA_UPLOAD_MAX_NUMBER_FIELDS."
            return error_response(str(exc), limit)
        request = context.get("request")
        refusal = None if request is not None and request.method in SAFE_METHODS else storage.write_refusal(exc)  # only a write is refused
        if refusal is not None:
            return store_refusal_response(exc, refusal, request)
        return None  # Django's handler500 answers, as JSON, below.
    if isinstance(exc, exceptions.ValidationError):
        response.data = {"error": _first_message(exc.detail), "fields": exc.detail}
    elif isinstance(exc, exceptions.UnsupportedMediaType):
        response.data = {"error": _unsupported_media_type(exc, context.get("request"))}
    elif isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        response.data = {"error": _unaccepted_scheme(context.get("request")) or str(exc.detail)}
        response.status_code = status.HTTP_401_UNAUTHORIZED
    else:
        response.data = {"error": str(exc.detail) if hasattr(exc, "detail") else str(exc)}
    if response.status_code == 404 and not response.data["error"].strip():
        response.data["error"] = _unnamed_not_found(context.get("request"))
    elif response.status_code == 404:
        response.data["error"] = _named_not_found(response.data["error"], context.get("kwargs") or {}, context.get("request"))
    return response


def _unsupported_media_type(exc, request) -> str:
    """DRF's words name only what was sent ("Unsupported media type "application/octet-stream"
    in request."): a newcomer uploading raw bytes was not told to send a form."""
    takes = [parser.media_type for parser in getattr(request, "parsers", ())]
    if "multipart/form-data" in takes:
        return f"{exc.detail} This endpoint takes multipart/form-data (the file in a form field, as curl -F sends it)."
    return f"{exc.detail} This endpoint takes {' or '.join(takes)}." if takes else str(exc.detail)


# Schemes an answer may name back: any other first word could be a token sent first.
KNOWN_SCHEMES = {"basic", "bearer", "token", "digest", "negotiate", "apikey", "api-key", "jwt", "oauth", "hoba", "mutual", "aws4-hmac-sha256"}


def _unaccepted_scheme(request) -> str | None:
    """Why credentials sent in a scheme this endpoint does not take were ignored: "not
    provided" read as if the header had been lost (the README's curl lines use Bearer for
    workers and /metrics, Token for the API). The token itself is never repeated."""
    header = request.META.get("HTTP_AUTHORIZATION", "") if request is not None else ""
    accepted = [authenticator.keyword for authenticator in getattr(request, "authenticators", ()) if hasattr(authenticator, "keyword")]
    if not header.strip() or not accepted:
        return None
    words = header.split()
    if words[0].lower() in (keyword.lower() for keyword in accepted):
        return None  # an accepted scheme: DRF's own words say what is wrong with it
    schemes = " or ".join(f"'Authorization: {keyword} <token>'" for keyword in accepted)
    if len(words) == 1:
        return f"the Authorization header has no scheme before its token: send {schemes}"
    if words[0].lower() not in KNOWN_SCHEMES:  # its first word may be the token itself: never said back
        return f"the Authorization header's first word is not a scheme accepted here: send {schemes}"
    return f"the Authorization header's scheme {words[0]!r} is not accepted here: send {schemes}"


# get_object_or_404's "No ModelVersion matches the given query." names a table, not what
# was asked for; the URL's own words do: (noun, the URL keyword that holds its id).
DJANGO_NOT_FOUND = re.compile(r"No (\w+) matches the given query\.")
NOT_FOUND_WORDS = {"ModelVersion": ("version", "number"), "Rollout": ("rollout", "pk"), "Job": ("job", "job_id"),
                   "EvaluationDataset": ("data set", "dataset")}


def _named_not_found(message: str, kwargs: dict, request=None) -> str:
    match = DJANGO_NOT_FOUND.fullmatch(message)
    if match is None:
        return message
    from registry.models import RegisteredModel  # models import this module's neighbours; keep it light

    name = kwargs.get("name")
    if name is not None and (match[1] == "RegisteredModel" or not RegisteredModel.objects.filter(name=name).exists()):
        other = RegisteredModel.objects.filter(name__iexact=name).values_list("name", flat=True).first()
        if other:
            return f"no model named {name!r} (names keep their case: did you mean {other!r}?)"
        # An upload to a model not made yet: a newcomer was told only that it did not exist.
        first = f"; create it first: POST /api/models/ with {{\"name\": \"{name}\"}}" if getattr(request, "method", "") == "POST" else ""
        return f"no model named {name!r}{first}"
    noun, key = NOT_FOUND_WORDS.get(match[1], (None, None))
    if noun is None or key not in kwargs:
        return f"no such {match[1]}"
    return f"model {name!r} has no {noun} {kwargs[key]!r}"


def _unnamed_not_found(request) -> str:
    """DRF's content negotiation refuses an unknown ``?format=`` with a 404 that says nothing."""
    wanted = request.query_params.get("format") if request is not None else None
    if wanted is not None:
        return f"format {wanted[:40]!r} is not one this endpoint answers: leave out ?format= for JSON"
    return f"no such resource: {request.path if request is not None else ''}"


def error_response(message: str, status_code: int, **extra) -> Response:
    return Response({"error": message, **extra}, status=status_code)


def store_refusal_response(exc: OSError, refusal: tuple[int, str], request) -> Response:
    """507 (full) or 503 (refusing writes), naming the problem; the staged file is gone already (``StagingWriter``)."""
    where = "" if request is None else f" on {request.method} {request.path}"
    logger.error("the artifact store could not keep a file%s: %s", where, exc)
    status_code, message = refusal
    response = error_response(message, status_code)
    if status_code == status.HTTP_503_SERVICE_UNAVAILABLE:
        response["Retry-After"] = str(STORE_RETRY_AFTER_S)
    return response


# What each refusal means, for the OpenAPI schema: every operation lists the statuses it
# can answer, so generated clients know every body they may get.
ERROR_MEANINGS = {
    400: "The request is invalid; the error names the first problem.",
    401: "Not signed in: send `Authorization: Token <key>` (or a session cookie).",
    403: "Signed in, but this role may not do this (viewers only read; the worker token only serves).",
    404: "No such model, version or resource.",
    406: "The `Accept` header names no type this endpoint can answer.",
    409: "The change conflicts with the current state; nothing was changed.",
    410: "Deleted by retention (a version's artifact, a job's output).",
    413: "The upload is larger than its limit: MAX_UPLOAD_BYTES (models), JOB_MAX_INPUT_BYTES (job inputs), DATASET_MAX_BYTES (data sets).",
    415: "The body's Content-Type is not one this endpoint reads.",
    422: "The ONNX file is well formed but cannot be served; nothing was stored.",
    429: "A worker id reports faster than WORKER_REPORTS_PER_S allows: report again after `Retry-After` seconds.",
    503: ("Busy (too many inspections at once), a dependency (the database) is down, a ready version's file is missing "
          "from the artifact store (its volume not mounted), or the store refuses writes (read-only, permissions): "
          "retry after `Retry-After` seconds."),
    507: "The artifact store's disk is full (or over its quota): nothing was kept; send the file again once there is room.",
}

# Every operation can meet these: authentication, permissions, content negotiation, and
# a database outage (console/outage.py answers it for every path).
COMMON_ERRORS = (401, 403, 406, 503)


def error_responses(*codes: int, conflict=None) -> dict[int, OpenApiResponse]:
    """The documented refusals of one operation; ``conflict`` replaces 409's body."""
    from registry.api.serializers import (
        ErrorSerializer,  # serializers import models; keep this module light
    )

    responses = {code: OpenApiResponse(ErrorSerializer, description=ERROR_MEANINGS[code]) for code in sorted({*COMMON_ERRORS, *codes})}
    if conflict is not None and 409 in responses:
        responses[409] = OpenApiResponse(conflict, description=ERROR_MEANINGS[409])
    return responses


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
