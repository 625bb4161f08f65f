"""REST API views: they parse, call the registry's functions, and answer."""

from __future__ import annotations

from django.conf import settings
from django.http import FileResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import events, storage, uploads
from registry.api import serializers
from registry.api.errors import error_response
from registry.api.permissions import IsWorkerOrStaff, WorkerTokenAuthentication
from registry.choices import VersionStatus
from registry.models import ModelVersion, RegisteredModel
from registry.state import desired_state
from registry.upload_handler import StagedUploadedFile, discard_staged_files


def get_model(name: str) -> RegisteredModel:
    return get_object_or_404(RegisteredModel, name=name)


class ModelList(generics.ListCreateAPIView):
    queryset = RegisteredModel.objects.all()

    def get_serializer_class(self):
        return serializers.ModelCreateSerializer if self.request.method == "POST" else serializers.ModelSerializer

    def perform_create(self, serializer):
        model = serializer.save(created_by=self.request.user)
        events.model_created(model, self.request.user)

    def create(self, request, *args, **kwargs):
        super().create(request, *args, **kwargs)
        model = RegisteredModel.objects.get(name=request.data["name"])
        return Response(serializers.ModelSerializer(model).data, status=status.HTTP_201_CREATED)


class ModelDetail(generics.RetrieveAPIView):
    serializer_class = serializers.ModelSerializer
    queryset = RegisteredModel.objects.all()
    lookup_field = "name"


class VersionList(generics.ListAPIView):
    serializer_class = serializers.VersionSerializer
    parser_classes = [MultiPartParser, FormParser]

    def get_queryset(self):
        return get_model(self.kwargs["name"]).versions.select_related("model", "uploaded_by")

    @extend_schema(
        request=serializers.VersionUploadSerializer,
        responses={201: serializers.VersionSerializer},
        description=(
            "Upload an ONNX file. It is inspected (ONNX checker, no external data, known operator domains, "
            "a real ONNX Runtime session run once) before anything is stored. A refused upload creates no "
            "version and leaves no file: 400 (not an ONNX model, empty), 413 (over MAX_UPLOAD_BYTES) or 422 "
            "(unusable model), with {\"error\": reason}; the refusal is kept in the model's audit timeline. "
            "An accepted version is 'ready' at once."
        ),
    )
    def post(self, request, name: str):
        model = get_model(name)
        try:
            return self._upload(request, model)
        finally:
            discard_staged_files(request._request)

    def _upload(self, request, model: RegisteredModel) -> Response:
        form = serializers.VersionUploadSerializer(data=request.data)
        if getattr(request._request, "upload_too_large", False):
            return error_response(str(storage.UploadTooLarge(settings.MAX_UPLOAD_BYTES)), status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        form.is_valid(raise_exception=True)
        artifact = form.validated_data["artifact"]
        if not isinstance(artifact, StagedUploadedFile):
            return error_response("the artifact must be sent as a multipart file field named 'artifact'", status.HTTP_400_BAD_REQUEST)
        try:
            version = uploads.register_staged(model, artifact.staged, uploaded_by=request.user, description=form.validated_data["description"])
        except uploads.UploadRefused as refusal:
            return error_response(refusal.reason, refusal.status)
        return Response(serializers.VersionSerializer(version).data, status=status.HTTP_201_CREATED)


class VersionDetail(generics.RetrieveAPIView):
    serializer_class = serializers.VersionSerializer

    def get_object(self):
        return get_object_or_404(ModelVersion.objects.select_related("model"), model__name=self.kwargs["name"], number=self.kwargs["number"])


class VersionMetricHistory(generics.ListAPIView):
    """Per-minute roll-ups of what workers reported for this version, oldest first."""

    serializer_class = serializers.MetricMinuteSerializer

    def get_queryset(self):
        version = get_object_or_404(ModelVersion, model__name=self.kwargs["name"], number=self.kwargs["number"])
        return version.metric_minutes.order_by("minute")


class VersionArtifact(APIView):
    """The stored ONNX bytes, with their sha256 in ``X-Artifact-SHA256``."""

    authentication_classes = [WorkerTokenAuthentication, *APIView.authentication_classes]
    permission_classes = []

    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    def get(self, request, name: str, number: int):
        if not request.user or not request.user.is_authenticated:
            return error_response("authentication required", status.HTTP_401_UNAUTHORIZED)
        version = get_object_or_404(ModelVersion.objects.select_related("model"), model__name=name, number=number)
        if version.status == VersionStatus.ARCHIVED or not storage.exists(version.sha256):
            return error_response(f"the artifact of {version} was deleted by retention", status.HTTP_410_GONE)
        response = FileResponse(open(storage.path_for(version.sha256), "rb"), as_attachment=True, filename=f"{name}-v{number}.onnx", content_type="application/octet-stream")
        response["X-Artifact-SHA256"] = version.sha256
        return response


class ReleaseHistory(generics.ListAPIView):
    serializer_class = serializers.ReleaseSerializer

    def get_queryset(self):
        return get_model(self.kwargs["name"]).releases.select_related("actor", "rollback_target")


class ServingState(APIView):
    """The whole desired serving state, for workers (Bearer worker token) and staff."""

    authentication_classes = [WorkerTokenAuthentication, *APIView.authentication_classes]
    permission_classes = [IsWorkerOrStaff]

    def get(self, request):
        return Response(desired_state())
