"""Translate registry rows to JSON and requests to arguments; no rules live here."""

from __future__ import annotations

from django.urls import reverse
from rest_framework import serializers

from registry.models import AuditEvent, Drill, ModelVersion, RegisteredModel, Release, VersionMetricMinute, Worker


class UserNameField(serializers.RelatedField):
    def to_representation(self, value):
        return value.get_username()


class RouteSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1)
    weight = serializers.IntegerField(min_value=0, max_value=100)
    shadow = serializers.FloatField(required=False)


class ReleaseSerializer(serializers.ModelSerializer):
    actor = UserNameField(read_only=True)
    routes = RouteSerializer(many=True, read_only=True)
    rollback_target_generation = serializers.SerializerMethodField()

    class Meta:
        model = Release
        fields = ["generation", "action", "routes", "stable_version", "rollback_target_generation", "actor", "reason", "created_at"]

    def get_rollback_target_generation(self, release) -> int | None:
        target = release.rollback_target
        return None if target is None else target.generation


class ModelSerializer(serializers.ModelSerializer):
    created_by = UserNameField(read_only=True)
    current_release = serializers.SerializerMethodField()
    versions_count = serializers.SerializerMethodField()

    class Meta:
        model = RegisteredModel
        fields = ["name", "description", "created_at", "created_by", "max_batch_size", "max_queue_delay_s", "latency_target_s", "versions_count", "current_release"]
        read_only_fields = ["created_at"]

    def get_current_release(self, model) -> dict | None:
        release = model.current_release()
        return None if release is None else ReleaseSerializer(release).data

    def get_versions_count(self, model) -> int:
        return model.versions.count()


class ModelCreateSerializer(serializers.ModelSerializer):
    class Meta:
        model = RegisteredModel
        fields = ["name", "description", "max_batch_size", "max_queue_delay_s", "latency_target_s"]


class VersionSerializer(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    uploaded_by = UserNameField(read_only=True)
    artifact_url = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = [
            "model", "number", "status", "status_reason", "sha256", "size_bytes", "signature", "opset", "producer",
            "validation_report", "description", "metrics", "uploaded_by", "created_at", "archived_at", "artifact_url",
        ]

    def get_artifact_url(self, version) -> str | None:
        if version.status == "archived":
            return None
        return reverse("api-version-artifact", kwargs={"name": version.model.name, "number": version.number})


class VersionUploadSerializer(serializers.Serializer):
    artifact = serializers.FileField(allow_empty_file=True, help_text="The ONNX file (multipart form field).")
    description = serializers.CharField(required=False, allow_blank=True, default="")


class SetRoutesSerializer(serializers.Serializer):
    routes = serializers.ListField(child=serializers.DictField(), allow_empty=False)
    reason = serializers.CharField(required=False, allow_blank=True, default="")


class RestoreSerializer(serializers.Serializer):
    generation = serializers.IntegerField(min_value=1)
    reason = serializers.CharField(required=False, allow_blank=True, default="")


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="")


class DrillRequestSerializer(serializers.Serializer):
    roll_forward = serializers.BooleanField(required=False, default=False)


class DrillSerializer(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    actor = UserNameField(read_only=True)

    class Meta:
        model = Drill
        fields = [
            "id", "model", "actor", "status", "roll_forward", "from_generation", "to_generation", "started_at", "finished_at",
            "first_ack_s", "last_ack_s", "confirmed_s", "failed_requests", "target_s", "workers", "error",
        ]


class WorkerSerializer(serializers.ModelSerializer):
    class Meta:
        model = Worker
        fields = ["worker_id", "host", "pid", "url", "device", "generation", "ok", "error", "loaded", "started_at", "last_seen_at", "last_report"]


class MetricMinuteSerializer(serializers.ModelSerializer):
    class Meta:
        model = VersionMetricMinute
        fields = ["minute", "requests", "errors", "latency_sum_s", "latency_buckets", "batch_size_buckets"]


class AuditEventSerializer(serializers.ModelSerializer):
    actor = UserNameField(read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["kind", "message", "actor", "data", "created_at"]
