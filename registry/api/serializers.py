"""Translate registry rows to JSON and requests to arguments; no rules live here."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import models
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from registry.actions import rollouts
from registry.api.request_keys import RefusesUnknownKeys
from registry.domain import audit_log
from registry.domain.canary_analysis import (
    AnalysisSettings,
    InvalidAnalysis,
    json_schema,
)
from registry.domain.choices import ACTIVE_ROLLOUT_STATUSES, JobKind, JobStatus, VersionStatus
from registry.domain.reasons import refuse_control_characters
from registry.domain.tags import (
    MAX_TAG_LENGTH,
    MAX_TAGS,
    TAG_PATTERN,
    InvalidTags,
    check_tags,
)
from registry.domain.text import refuse_hidden_characters, refuse_reserved_model_name
from registry.fleet import workers as fleet
from registry.models import (
    AuditEvent,
    Drill,
    Job,
    ModelVersion,
    RegisteredModel,
    Release,
    Rollout,
    RolloutVerdict,
    VersionMetricMinute,
    Worker,
)

# As the console's forms: a description is a note for people, not a place to store data.
DESCRIPTION_MAX_CHARS = 2000


@extend_schema_field({"type": "string", "nullable": True, "description": "The username, or null when nobody (or a deleted user) acted."})
class UserNameField(serializers.RelatedField):
    def to_representation(self, value):
        return value.get_username()


class ErrorSerializer(serializers.Serializer):
    """Every refusal: ``{"error": reason}``; form errors add ``fields``."""

    error = serializers.CharField(help_text="What was wrong, in words.")
    fields = serializers.DictField(required=False, help_text="Per-field messages, when the body did not validate.")


class GenerationConflictSerializer(ErrorSerializer):
    """A traffic change decided on an older view of the model: nothing was changed."""

    expected_generation = serializers.IntegerField(required=False, help_text="The generation the request was made for.")
    current_generation = serializers.IntegerField(required=False, help_text="The generation of the model's newest release now (0: none).")
    current_action = serializers.CharField(required=False, allow_null=True)
    current_actor = serializers.CharField(required=False, allow_null=True)
    current_at = serializers.DateTimeField(required=False, allow_null=True)


# Generations are 64-bit columns: a larger number is refused here rather than by the
# database (PostgreSQL would fail the query with an out-of-range error).
GENERATION_MAX = 2**63 - 1

EXPECTED_GENERATION_HELP = (
    "The generation of the model's newest release as you saw it (0 when it has none). When it is "
    "sent and the model has moved on, the change is refused with 409 and nothing is changed, so a "
    "double submit or two operators never act twice. Optional for API clients; the console always sends it."
)


class JSONTypeMixin:
    """A JSON body's values must already have the declared type: DRF would otherwise
    read ``false`` as 0.0, ``"5"`` as 5 and 3 as "3", and accept what the schema
    says is invalid. Each field keeps its own "invalid" message."""

    json_types: tuple[type, ...] = ()

    def to_internal_value(self, data):
        wants_bool = bool in self.json_types
        if isinstance(data, bool) != wants_bool or not isinstance(data, self.json_types):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(JSONTypeMixin, serializers.CharField):
    json_types = (str,)


class StrictSlugField(JSONTypeMixin, serializers.SlugField):
    json_types = (str,)


class StrictRegexField(JSONTypeMixin, serializers.RegexField):
    json_types = (str,)


class StrictIntegerField(JSONTypeMixin, serializers.IntegerField):
    json_types = (int,)


class StrictFloatField(JSONTypeMixin, serializers.FloatField):
    json_types = (int, float)


class StrictBooleanField(JSONTypeMixin, serializers.BooleanField):
    json_types = (bool,)


class StrictModelSerializer(RefusesUnknownKeys, serializers.ModelSerializer):
    """A model serializer for JSON bodies, built from the strict fields above; a key it does
    not take (unknown, misspelt or read-only) is refused, naming what it takes."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.CharField: StrictCharField,
        models.TextField: StrictCharField,
        models.SlugField: StrictSlugField,
        models.IntegerField: StrictIntegerField,
        models.PositiveIntegerField: StrictIntegerField,
        models.PositiveBigIntegerField: StrictIntegerField,
        models.FloatField: StrictFloatField,
        models.BooleanField: StrictBooleanField,
    }


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


TAGS_SCHEMA = {
    "type": "array", "maxItems": MAX_TAGS, "uniqueItems": True,
    "items": {"type": "string", "minLength": 1, "maxLength": MAX_TAG_LENGTH, "pattern": TAG_PATTERN},
    "description": f"Short labels for finding the model: lowercase letters, digits, '.', '_' and '-'; at most {MAX_TAGS}, each once.",
}


@extend_schema_field(TAGS_SCHEMA)
class TagsField(serializers.Field):
    """Tags, checked by ``registry.domain.tags.check_tags`` (which names the first bad one)."""

    def to_internal_value(self, data):
        try:
            return check_tags(data)
        except InvalidTags as error:
            raise serializers.ValidationError(str(error)) from None

    def to_representation(self, value):
        return list(value)


OWNER_HELP = "The username of whoever answers for the model (an active user), or null for nobody; the creator when not given."


# "" is null, as DRF reads it for every related field: the request's schema says so (no minLength).
@extend_schema_field({"type": "string", "nullable": True})
class OwnerField(serializers.SlugRelatedField):
    """An active user by username; anything but a string is refused as invalid."""

    default_error_messages = {"null_characters": "a username cannot contain NUL (\\u0000) characters."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        if "\x00" in data:  # PostgreSQL refuses NUL in a text parameter: the lookup itself would fail (a 500)
            self.fail("null_characters")
        return super().to_internal_value(data)


def owner_field(**kwargs) -> OwnerField:
    return OwnerField(slug_field="username", queryset=get_user_model().objects.filter(is_active=True), allow_null=True, help_text=OWNER_HELP,
                      error_messages={"does_not_exist": "no active user has that username", "invalid": "must be a username (a string) or null"}, **kwargs)


class ModelSerializer(serializers.ModelSerializer):
    created_by = UserNameField(read_only=True)
    owner = UserNameField(read_only=True)
    tags = TagsField(read_only=True)
    archived = serializers.SerializerMethodField()
    current_release = serializers.SerializerMethodField()
    versions_count = serializers.SerializerMethodField()

    class Meta:
        model = RegisteredModel
        fields = ["name", "description", "tags", "owner", "archived", "archived_at", "created_at", "created_by", "max_batch_size", "max_queue_delay_s",
                  "latency_target_s", "analysis", "versions_count", "current_release"]
        read_only_fields = ["created_at", "archived_at"]

    def get_archived(self, model) -> bool:
        return model.is_archived

    @extend_schema_field(ReleaseSerializer(allow_null=True))
    def get_current_release(self, model):
        release = model.current_release()
        return None if release is None else ReleaseSerializer(release).data

    def get_versions_count(self, model) -> int:
        return model.versions.count()


class ModelCreateSerializer(StrictModelSerializer):
    tags = TagsField(required=False)
    owner = owner_field(required=False)

    class Meta:
        model = RegisteredModel
        fields = ["name", "description", "tags", "owner", "max_batch_size", "max_queue_delay_s", "latency_target_s"]
        # A name taken is the catalogue's 409 (as one taken but for its case is), not a 400; a reserved one is a 400.
        extra_kwargs = {"description": {"max_length": DESCRIPTION_MAX_CHARS}, "name": {"validators": [refuse_reserved_model_name]}}


@extend_schema_field(json_schema())
class AnalysisField(serializers.DictField):
    """Canary-analysis thresholds; checked by ``AnalysisSettings.parse``, which names the field."""


class ModelUpdateSerializer(StrictModelSerializer):
    """What PATCH may change: the description and the model's canary-analysis thresholds
    (checked against the documented fields and ranges; the batching fields travel to the
    workers with the desired state, so they are set at creation)."""

    analysis = AnalysisField(required=False)
    tags = TagsField(required=False)
    owner = owner_field(required=False)

    class Meta:
        model = RegisteredModel
        fields = ["description", "tags", "owner", "analysis"]
        extra_kwargs = {"description": {"max_length": DESCRIPTION_MAX_CHARS}}

    def validate_analysis(self, value):
        try:
            AnalysisSettings.parse(value)
        except InvalidAnalysis as error:
            raise serializers.ValidationError(str(error)) from None
        return value


VALIDATION_JOB_SCHEMA = {
    "type": "object", "nullable": True,
    "properties": {"id": {"type": "integer"}, "status": {"type": "string", "enum": list(JobStatus.values)}, "error": {"type": "string"}},
    "description": "The version's validation job (null for a version registered inline, e.g. the demo models).",
}


def with_validation_jobs(versions: models.QuerySet) -> models.QuerySet:
    """Versions with their validation job fetched in one more query (``validation_jobs``)."""
    return versions.prefetch_related(models.Prefetch("jobs", queryset=Job.objects.filter(kind=JobKind.VALIDATION), to_attr="validation_jobs"))


class VersionUpdateSerializer(StrictModelSerializer):
    """What PATCH may change of a version: its description (the bytes, and what was found
    of them, stay as uploaded)."""

    class Meta:
        model = ModelVersion
        fields = ["description"]
        extra_kwargs = {"description": {"max_length": DESCRIPTION_MAX_CHARS}}


class VersionSerializer(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    uploaded_by = UserNameField(read_only=True)
    artifact_url = serializers.SerializerMethodField()
    validation_job = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = [
            "model", "number", "status", "status_reason", "sha256", "size_bytes", "signature", "opset", "producer",
            "validation_report", "validation_job", "description", "metrics", "uploaded_by", "created_at", "archived_at", "artifact_url",
        ]

    def get_artifact_url(self, version) -> str | None:
        if version.status != VersionStatus.READY:  # nothing to download while validating, once rejected or archived
            return None
        return reverse("api-version-artifact", kwargs={"name": version.model.name, "number": version.number})

    @extend_schema_field(VALIDATION_JOB_SCHEMA)
    def get_validation_job(self, version) -> dict | None:
        jobs = getattr(version, "validation_jobs", None)
        if jobs is None:
            jobs = list(version.jobs.filter(kind=JobKind.VALIDATION))
        job = jobs[0] if jobs else None
        return None if job is None else {"id": job.pk, "status": job.status, "error": job.error}


@extend_schema_field({"type": "object", "description": "The validation job's payload (as GET …/jobs/{id}/ answers it)."})
class JobPayloadField(serializers.DictField):
    pass


class VersionUploadAnswerSerializer(VersionSerializer):
    """The 202 of an upload: the version (status 'validating') and its validation job."""

    job = JobPayloadField(read_only=True)

    class Meta(VersionSerializer.Meta):
        fields = [*VersionSerializer.Meta.fields, "job"]


class VersionUploadSerializer(RefusesUnknownKeys, serializers.Serializer):
    artifact = serializers.FileField(allow_empty_file=True, help_text="The ONNX file (multipart form field).")
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=DESCRIPTION_MAX_CHARS,
                                        validators=[refuse_hidden_characters])
    allow_duplicate = serializers.BooleanField(required=False, default=False, help_text=(
        "Register the file as a new version even when its sha256 equals an existing version's of this model "
        "(otherwise that upload is refused with 409, naming the version)."))


class DuplicateUploadSerializer(ErrorSerializer):
    """An upload whose bytes are an existing version's: nothing was stored."""

    existing_version = serializers.IntegerField(required=False, help_text="The number of the version with the same sha256.")
    url = serializers.CharField(required=False, help_text="That version in the API (GET it).")
    page_url = serializers.CharField(required=False, help_text="That version's page in the console.")


class ArchiveSerializer(RefusesUnknownKeys, serializers.Serializer):
    reason = StrictCharField(required=False, allow_blank=True, default="", max_length=500, validators=[refuse_control_characters],
                             help_text="Why; recorded in the audit timeline.")


FORCE_HELP = ("Route traffic to a version whose inputs differ from the stable version's (names, datatypes, non-batch "
              "dimensions), that the live workers failed to load, or whose stored file is missing, of another size than "
              "uploaded, a symbolic link or seen changed. Needs a reason; recorded in the audit timeline.")


class ReasonSerializer(RefusesUnknownKeys, serializers.Serializer):
    reason = StrictCharField(required=False, allow_blank=True, default="", max_length=500,  # as the console's form field
                             validators=[refuse_control_characters])
    expected_generation = StrictIntegerField(required=False, min_value=0, max_value=GENERATION_MAX, help_text=EXPECTED_GENERATION_HELP)


class LengthFirstListField(serializers.ListField):
    """A list refused by its length before any item is read: DRF checks ``max_length`` after
    validating every item, so 600,000 rollout steps held a console thread 5.8 s before
    being refused for more than 20."""

    def to_internal_value(self, data):
        if self.max_length is not None and isinstance(data, list) and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)


MAX_ROUTES = 256  # a split of more versions than any model keeps ready


# Routes are checked by ``registry.domain.traffic`` (which names the first bad item); the schema
# still describes them, so generated clients send objects of the right shape.
@extend_schema_field(RouteSerializer(many=True))
class RoutesField(LengthFirstListField):
    child = serializers.DictField()


class SetRoutesSerializer(ReasonSerializer):
    routes = RoutesField(allow_empty=False, max_length=MAX_ROUTES, error_messages={"max_length": "at most {max_length} routes"})
    force = StrictBooleanField(required=False, default=False, help_text=FORCE_HELP)


class PromoteSerializer(ReasonSerializer):
    force = StrictBooleanField(required=False, default=False, help_text=(
        "Promote a canary the live workers say they failed to load, or whose stored file is missing or changed (refused "
        "otherwise: they would go on serving what they serve now). Needs a reason; recorded in the audit timeline."))


class RestoreSerializer(ReasonSerializer):
    generation = StrictIntegerField(min_value=1, max_value=GENERATION_MAX)
    force = StrictBooleanField(required=False, default=False, help_text=(
        "Restore routes that give traffic to a version the live workers failed to load, or whose stored file is missing or "
        "changed (refused otherwise: they would go on serving what they serve now). Needs a reason; recorded in the audit timeline."))


class DrillRequestSerializer(RefusesUnknownKeys, serializers.Serializer):
    roll_forward = StrictBooleanField(required=False, default=True, help_text="Restore the split the drill rolled back from once every worker followed (the default).")
    expected_generation = StrictIntegerField(required=False, min_value=0, max_value=GENERATION_MAX, help_text=EXPECTED_GENERATION_HELP)


class WorkerConvergenceSerializer(serializers.Serializer):
    worker_id = serializers.CharField()
    generation = serializers.IntegerField()
    converged = serializers.BooleanField(help_text="Serving the content the console issued for this release's generation or later, proved by its "
                                                    "digest, or serving this model's part of it, proved by the model's digest, while "
                                                    "another model fails on the worker.")
    state = serializers.CharField(help_text="The worker's state in words, e.g. 'no state applied yet'.")
    ok = serializers.BooleanField()
    error = serializers.CharField(allow_blank=True)
    rollback_warm = serializers.BooleanField()
    last_seen_at = serializers.DateTimeField()


class SilentWorkerSerializer(serializers.Serializer):
    worker_id = serializers.CharField()
    silent_s = serializers.FloatField()
    state = serializers.CharField()
    last_seen_at = serializers.DateTimeField()


class ReleaseStateSerializer(serializers.Serializer):
    """A model's current release and how far the live workers are in serving it."""

    model = serializers.CharField()
    archived = serializers.BooleanField(help_text="The model is archived: its release (action `archive`) routes nothing and workers do not serve it.")
    release = ReleaseSerializer(allow_null=True)
    rollback_returns_to = serializers.CharField(allow_null=True, help_text="What a rollback from this release returns to, in words; null when nothing.")
    workers = WorkerConvergenceSerializer(many=True)
    unconfirmed_silent = SilentWorkerSerializer(many=True, help_text=(
        "Workers silent past WORKER_GONE_AFTER_S for less than a minute that have not proved this release: frozen or cut off from the "
        "console, they may still serve what it replaced. Each keeps `converged` false."))
    converged = serializers.BooleanField(help_text="Every live worker serves this release, proved by digest, and no recently silent worker is unconfirmed.")
    live_converged = serializers.BooleanField(help_text="Every live worker serves this release, proved by digest (whatever the silent ones do).")
    failing_elsewhere = serializers.IntegerField(help_text="Of the workers converged for this model, how many fail to apply "
                                                           "another model (their state in words says which).")
    rollback_ready = serializers.BooleanField()
    warning = serializers.CharField(
        required=False, help_text="Only when the database failed right after the change was committed: what this answer could not read.")
    evaluated_worse = serializers.ListField(child=serializers.CharField(), required=False, help_text=(
        "Only in a traffic action's answer, and only when it gave traffic to a version evaluated worse than the stable version it "
        "replaced or joined (more than one point of accuracy, or 5 % of MAE or MSE, on the same bytes of a data set): each in words. "
        "The change is made; this says what it was made despite."))


class DrillSerializer(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    actor = UserNameField(read_only=True)
    forward_pending = serializers.BooleanField(read_only=True, help_text=(
        "Asked to roll forward, and the roll forward is neither made nor ruled out yet: true while the drill runs, and after "
        "an outage cut its request short, until the console makes it (at the earliest 3 × DRILL_ACK_TIMEOUT_S + 60 s after the start)."))
    forward_unconfirmed = serializers.ListField(child=serializers.CharField(), read_only=True, help_text=(
        "Workers that followed the rollback but did not confirm the roll forward's content within DRILL_ACK_TIMEOUT_S (the "
        "summary, `error`, says why for each): `status` is the rollback's, so a passed drill with entries here left its fleet split."))
    not_measured = serializers.ListField(child=serializers.CharField(), read_only=True, help_text=(
        "Workers gone (silent past WORKER_GONE_AFTER_S) when the drill started, so not waited for: a passed drill says nothing of "
        "them, and a frozen one may still hold its port."))

    class Meta:
        model = Drill
        fields = [
            "id", "model", "actor", "status", "roll_forward", "from_generation", "to_generation", "to_digest", "forward_generation",
            "forward_pending", "forward_unconfirmed", "not_measured", "started_at", "finished_at",
            "first_ack_s", "last_ack_s", "confirmed_s", "failed_requests", "target_s", "workers", "error",
        ]


class WorkerSerializer(serializers.ModelSerializer):
    """A worker as last heard of; ``converged`` and ``state`` are judged against the
    current desired state (the context's ``generation`` and ``digests``)."""

    digest = serializers.SerializerMethodField(help_text="The digest of what the worker serves as `generation`: from its ack when that "
                                               "is newer than its last report (an ack is stored only with the digest issued for it).")
    converged = serializers.SerializerMethodField()
    state = serializers.SerializerMethodField()
    lifecycle = serializers.SerializerMethodField(help_text="serving, draining (stopping gracefully), stopped (said so), or gone (silent)")

    class Meta:
        model = Worker
        fields = [
            "worker_id", "host", "pid", "url", "device", "generation", "digest", "converged", "state", "lifecycle", "ok", "error", "loaded",
            "started_at", "last_seen_at", "last_report",
        ]

    def get_lifecycle(self, worker) -> str:
        return fleet.lifecycle(worker)

    def get_digest(self, worker) -> str | None:
        return fleet.served_digest(worker, self.context["digests"])

    def get_converged(self, worker) -> bool:
        return self._status(worker)["converged"]

    def get_state(self, worker) -> str:
        return self._status(worker)["state"]

    def _status(self, worker) -> dict:
        cache = self.context.setdefault("statuses", {})
        if worker.pk not in cache:
            cache[worker.pk] = fleet.worker_status(worker, self.context["generation"], self.context["digests"])
        return cache[worker.pk]


class MetricMinuteSerializer(serializers.ModelSerializer):
    class Meta:
        model = VersionMetricMinute
        fields = ["minute", "requests", "errors", "client_errors", "latency_sum_s", "latency_buckets", "batch_size_buckets"]


class AuditEventSerializer(serializers.ModelSerializer):
    actor = UserNameField(read_only=True)
    reason = serializers.SerializerMethodField(help_text="What the person typed with the action; empty when none.")
    generation = serializers.SerializerMethodField(help_text="The generation this release (or the rollout's release) made; null for other events.")

    class Meta:
        model = AuditEvent
        fields = ["kind", "message", "actor", "reason", "generation", "data", "created_at"]

    def get_reason(self, event) -> str:
        return audit_log.reason(event)

    def get_generation(self, event) -> int | None:
        return audit_log.generation_made(event)


class RolloutStartSerializer(ReasonSerializer):
    canary_version = StrictIntegerField(min_value=1)
    steps = LengthFirstListField(child=serializers.JSONField(), required=False, max_length=rollouts.MAX_STEPS,
                                 error_messages={"max_length": f"at most {rollouts.MAX_STEPS} steps are allowed"},
                                  help_text="Percentages ending at 100, e.g. [1, 10, 50, 100] (the default); a first step of 0 is a shadow step.")
    shadow_fraction = serializers.JSONField(required=False, help_text="In a shadow step, the share of stable's requests mirrored to the canary (default 1).")
    step_duration_s = serializers.JSONField(required=False, help_text="How long a passing step holds before the next (default 300).")
    analysis = AnalysisField(required=False, default=dict, help_text="Thresholds over the model's and the documented defaults.")
    force = StrictBooleanField(required=False, default=False, help_text=FORCE_HELP)


class RolloutVerdictSerializer(serializers.ModelSerializer):
    class Meta:
        model = RolloutVerdict
        fields = ["number", "step_index", "weight", "window_start", "window_end", "result", "reason", "signals", "canary", "stable", "created_at"]


class RolloutSerializer(serializers.ModelSerializer):
    """A rollout's state; ``verdicts`` lists every window judged, newest first (the list
    of rollouts carries only the newest, as ``last_verdict``)."""

    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    actor = UserNameField(read_only=True)
    current_step = serializers.SerializerMethodField()
    current_weight = serializers.SerializerMethodField(
        help_text="The canary's share at the current step; null once the rollout finished (it sets no traffic then: the model's "
                  "release says what serves).")
    next_window_at = serializers.SerializerMethodField(help_text="When the next window is judged; null once the rollout finished.")
    last_verdict = serializers.SerializerMethodField()
    analysis_overdue_s = serializers.SerializerMethodField(
        help_text="Seconds the due window has waited past a few analysis ticks (the analysis is not running: is Celery beat up?); "
                  "null while it is on time or not analysed.")

    class Meta:
        model = Rollout
        fields = [
            "id", "model", "canary_version", "stable_version", "steps", "current_step", "current_weight", "step_duration_s", "shadow_fraction", "status",
            "status_reason", "analysis", "consecutive_failures", "windows_judged", "release_generation", "forced", "actor", "reason",
            "started_at", "step_started_at", "next_window_at", "analysis_overdue_s", "finished_at", "last_verdict",
        ]

    def get_current_step(self, rollout) -> int:
        return min(rollout.step_index, len(rollout.steps) - 1) + 1

    # A rolled-back rollout answered "current_weight": 10 and a next window after its end.
    def get_current_weight(self, rollout) -> int | None:
        return rollout.current_weight if rollout.status in ACTIVE_ROLLOUT_STATUSES else None

    def get_next_window_at(self, rollout) -> datetime | None:
        return rollout.next_window_at if rollout.status in ACTIVE_ROLLOUT_STATUSES else None

    def get_analysis_overdue_s(self, rollout) -> float | None:
        overdue = rollouts.analysis_overdue_s(rollout)
        return None if overdue is None else round(overdue, 1)

    @extend_schema_field(RolloutVerdictSerializer(allow_null=True))
    def get_last_verdict(self, rollout):
        verdict = rollout.verdicts.order_by("-number").first()
        return None if verdict is None else RolloutVerdictSerializer(verdict).data


class RolloutDetailSerializer(RolloutSerializer):
    verdicts = RolloutVerdictSerializer(many=True, read_only=True)
    evaluated_worse = serializers.ListField(child=serializers.CharField(), read_only=True, help_text=(
        "Only in a start's answer, and only when the canary was evaluated worse than the stable version (more than one point of "
        "accuracy, or 5 % of MAE or MSE, on the same bytes of a data set): each in words. The rollout is started; its analysis judges "
        "live traffic, not these."))

    class Meta(RolloutSerializer.Meta):
        fields = [*RolloutSerializer.Meta.fields, "verdicts", "evaluated_worse"]
