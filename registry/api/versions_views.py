"""REST API for a model's versions: upload and list, one version, its stored bytes and
its per-minute metrics."""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings
from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import exceptions, generics, status
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.actions import catalog, uploads
from registry.api import pagination, serializers
from registry.api.errors import error_response, error_responses
from registry.api.lookups import get_model
from registry.api.parsers import JSONParser
from registry.api.permissions import WorkerTokenAuthentication
from registry.api.streams import file_response
from registry.artifacts import served_bytes, storage
from registry.artifacts.upload_handler import (
    StagedUploadedFile,
    csrf_failure_from_headers,
    declared_too_large,
    start_staging,
)
from registry.committed_change import mark_committed
from registry.domain.choices import JobKind, VersionStatus
from registry.jobs import records
from registry.models import ModelVersion, RegisteredModel

logger = logging.getLogger(__name__)

ARTIFACT_SHA256_HEADER = OpenApiParameter("X-Artifact-SHA256", str, OpenApiParameter.HEADER, response=[200], description="The sha256 of the bytes, hex.")
# A ready version's file missing from the store is the store's fault (a volume not mounted,
# a console started on another DATA_DIR) and may come back; workers retry.
MISSING_FILE_RETRY_AFTER_S = 30


class HeaderCsrfSessionAuthentication(SessionAuthentication):
    """Session auth whose CSRF check reads the ``X-CSRFToken`` header, never the body:
    DRF's own check reads ``request.POST``, which would parse (and stage) the upload
    before the role is checked."""

    def enforce_csrf(self, request):
        reason = csrf_failure_from_headers(request._request)
        if reason:
            raise exceptions.PermissionDenied(f"CSRF Failed: {reason}")


@extend_schema_view(get=extend_schema(
    parameters=pagination.PAGE_PARAMETERS, responses={200: serializers.VersionSerializer(many=True), **error_responses(400, 404)},
))
class VersionList(generics.ListAPIView):
    serializer_class = serializers.VersionSerializer
    pagination_class = pagination.ByNumber
    parser_classes = [MultiPartParser, FormParser]
    # Authentication and the role check use headers and cookies only; the body is
    # parsed (and its file staged) in post(), after both have passed.
    authentication_classes = [TokenAuthentication, HeaderCsrfSessionAuthentication]

    def get_queryset(self):
        return serializers.with_validation_jobs(get_model(self.kwargs["name"]).versions.select_related("model", "uploaded_by"))

    @extend_schema(
        request=serializers.VersionUploadSerializer,
        responses={202: serializers.VersionUploadAnswerSerializer,
                   **error_responses(400, 403, 404, 409, 413, 415, 507, conflict=serializers.DuplicateUploadSerializer)},
        description=(
            "Upload an ONNX file. What is cheap to refuse is refused at once, creating no version and leaving "
            "no file: 400 (empty, or not an ONNX model: not a protobuf ModelProto with an IR version and a graph), "
            "413 (over MAX_UPLOAD_BYTES), 403 (not an operator), 507 (the artifact store's disk is full), with {\"error\": reason}; "
            "a refusal of the file itself is kept in "
            "the model's audit timeline. 409 when the model is archived, or when the bytes' sha256 equals an existing "
            "version's of this model: then the body names it (\"existing_version\", \"url\", \"page_url\") and nothing "
            "is stored or recorded, unless the form field allow_duplicate=true asks for a copy. Otherwise the bytes are stored and the answer is 202 at once: the new "
            "version, its number taken, with status 'validating', and \"job\", its validation job. The expensive "
            "checks (ONNX checker, no external data, known operator domains, a real ONNX Runtime session run at the "
            "batch sizes a worker warms) run after the answer and end in 'ready' or 'rejected'. A rejected version "
            "keeps its number and its validation_report (the checks run so far, and status_reason says why) but no "
            "artifact; only a ready version can be routed, served or downloaded. Poll GET "
            "/api/models/{name}/versions/{number}/ (status, validation_job) or the job until it ends."
        ),
    )
    def post(self, request, name: str):
        model = get_model(name)
        if declared_too_large(request._request):
            return _refused(uploads.refuse_too_large(model, request.user))
        staging = start_staging(request._request)
        try:
            return self._upload(request, model)
        finally:
            staging.discard()  # whatever happened: registered bytes have moved into the store

    def _upload(self, request, model: RegisteredModel) -> Response:
        form = serializers.VersionUploadSerializer(data=request.data)
        if getattr(request._request, "upload_too_large", False):
            return _refused(uploads.refuse_too_large(model, request.user))
        form.is_valid(raise_exception=True)
        artifact = form.validated_data["artifact"]
        if not isinstance(artifact, StagedUploadedFile):
            return error_response("the artifact must be sent as a multipart file field named 'artifact'", status.HTTP_400_BAD_REQUEST)
        try:
            version, job = uploads.accept_staged(model, artifact.staged, uploaded_by=request.user, description=form.validated_data["description"],
                                                 allow_duplicate=form.validated_data["allow_duplicate"])
        except uploads.DuplicateUpload as refusal:
            return error_response(refusal.reason, refusal.status, **duplicate_details(refusal.existing))
        except uploads.UploadRefused as refusal:
            return _refused(refusal)
        mark_committed(request, f"{model.name}: version {version.number} uploaded, job {job.pk} queued")
        # One read of the job for both places it appears: a Celery worker may have started
        # it meanwhile, and the answer said "running" in one and "queued" in the other.
        job.refresh_from_db()
        if job.kind == JobKind.VALIDATION:
            version.validation_jobs = [job]
        return Response({**serializers.VersionSerializer(version).data, "job": records.payload(job)}, status=status.HTTP_202_ACCEPTED)


def _refused(refusal: uploads.UploadRefused) -> Response:
    return error_response(refusal.reason, refusal.status)


def duplicate_details(existing: ModelVersion) -> dict:
    """What a duplicate upload's 409 carries beside ``error``: where the existing version is."""
    names = {"name": existing.model.name, "number": existing.number}
    return {"existing_version": existing.number, "url": reverse("api-version", kwargs=names), "page_url": reverse("version", kwargs=names)}


@extend_schema_view(
    get=extend_schema(responses={200: serializers.VersionSerializer, **error_responses(404)}),
    patch=extend_schema(request=serializers.VersionUpdateSerializer, responses={200: serializers.VersionSerializer, **error_responses(400, 403, 404, 415)},
                        description="Change the version's description (operators); recorded in the audit timeline."),
)
class VersionDetail(generics.RetrieveUpdateAPIView):
    serializer_class = serializers.VersionSerializer
    parser_classes = [JSONParser]
    http_method_names = ["get", "patch", "head", "options"]

    def get_object(self):
        versions = serializers.with_validation_jobs(ModelVersion.objects.select_related("model"))
        return get_object_or_404(versions, model__name=self.kwargs["name"], number=self.kwargs["number"])

    def update(self, request, *args, **kwargs):
        form = serializers.VersionUpdateSerializer(self.get_object(), data=request.data, partial=True)
        form.is_valid(raise_exception=True)
        if "description" in form.validated_data:
            catalog.change_version(form.instance, request.user, description=form.validated_data["description"])
        return Response(serializers.VersionSerializer(self.get_object()).data)


@extend_schema_view(get=extend_schema(
    parameters=pagination.PAGE_PARAMETERS, responses={200: serializers.MetricMinuteSerializer(many=True), **error_responses(400, 404)},
))
class VersionMetricHistory(generics.ListAPIView):
    """Per-minute roll-ups of what workers reported for this version, oldest first."""

    serializer_class = serializers.MetricMinuteSerializer
    pagination_class = pagination.ByMinute

    def get_queryset(self):
        version = get_object_or_404(ModelVersion, model__name=self.kwargs["name"], number=self.kwargs["number"])
        return version.metric_minutes.order_by("minute")


class VersionArtifact(APIView):
    """The stored ONNX bytes, with their sha256 in ``X-Artifact-SHA256``."""

    authentication_classes = [WorkerTokenAuthentication, *APIView.authentication_classes]
    # Any signed-in caller or a worker (not only the roles): with none at all, an anonymous
    # OPTIONS was answered (the API's metadata) before the 401 below.
    permission_classes = [IsAuthenticated]

    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiResponse(bytes), **error_responses(404, 409, 410)},
        description=("Only a ready version's bytes: 409 while it is validated, 410 once rejected or archived (no artifact kept), "
                     "503 with Retry-After while a ready version's file is missing from the store (the error names it under ARTIFACT_ROOT), "
                     "or once a whole download of it did not match its sha256 (the file changed after its upload), until "
                     "the file changes again."),
        parameters=[ARTIFACT_SHA256_HEADER],
    )
    def get(self, request, name: str, number: int):
        if not request.user or not request.user.is_authenticated:
            return error_response("authentication required", status.HTTP_401_UNAUTHORIZED)
        version = get_object_or_404(ModelVersion.objects.select_related("model"), model__name=name, number=number)
        if version.status == VersionStatus.VALIDATING:
            return error_response(f"{version} is still being validated; its artifact is served once it is ready", status.HTTP_409_CONFLICT)
        if version.status == VersionStatus.REJECTED:
            return error_response(f"{version} was rejected ({version.status_reason}); its artifact was not kept", status.HTTP_410_GONE)
        if version.status == VersionStatus.ARCHIVED:
            return error_response(f"the artifact of {version} was deleted by retention", status.HTTP_410_GONE)
        path = storage.path_for(version.sha256)
        if path.is_symlink():  # never followed (file_response opens with O_NOFOLLOW)
            return changed_in_store(version, path)
        if not path.is_file():
            return missing_from_store(version, path)
        _reported_missing.discard(str(path))
        if served_bytes.known_mismatch(path):
            return changed_in_store(version, path)
        response = file_response(request, path, as_attachment=True, filename=f"{name}-v{number}.onnx",
                                 content_type="application/octet-stream",
                                 check=lambda chunks, status: served_bytes.checked_as_streamed(chunks, path, version.sha256,
                                                                                               served_bytes.stat_key(status)))
        response["X-Artifact-SHA256"] = version.sha256
        return response


# Files reported missing by this process: a worker retries every few seconds, and the
# first ERROR says all there is to say until the file is served again.
_reported_missing: set[str] = set()


def in_store(path) -> str:
    """``path`` as answers name it: under ARTIFACT_ROOT, whose place on the console's disk
    they leave to its log (a viewer's download named the host's directory layout)."""
    try:
        return f"{Path(path).relative_to(Path(settings.ARTIFACT_ROOT))} under ARTIFACT_ROOT"
    except ValueError:
        return "its place under ARTIFACT_ROOT"


def changed_in_store(version: ModelVersion, path) -> Response:
    """503: the stored file no longer has the bytes uploaded (``served_bytes``)."""
    message = (f"the stored artifact of {version} does not match its sha256 {version.sha256[:12]}…: the file at {in_store(path)} changed "
               f"after its upload; restore its bytes there (uploading them again does not replace it), or route "
               f"{version.model.name} away from v{version.number}")
    response = error_response(message, status.HTTP_503_SERVICE_UNAVAILABLE)
    response["Retry-After"] = str(MISSING_FILE_RETRY_AFTER_S)
    return response


def missing_from_store(version: ModelVersion, path) -> Response:
    """503: the version is ready, so its file should be there; retention never deletes it."""
    message = (f"the artifact of {version} is missing from the artifact store: no file at {in_store(path)} (the console's log "
               f"names the whole path); is the store's volume mounted? retry in {MISSING_FILE_RETRY_AFTER_S} s")
    if str(path) not in _reported_missing:
        _reported_missing.add(str(path))
        logger.error("%s is ready but its file is missing: no file at %s (ARTIFACT_ROOT %s)", version, path, settings.ARTIFACT_ROOT)
    response = error_response(message, status.HTTP_503_SERVICE_UNAVAILABLE)
    response["Retry-After"] = str(MISSING_FILE_RETRY_AFTER_S)
    return response
