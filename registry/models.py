"""The registry's truth: models, versions, releases, drills, workers and the audit trail.

Who did something (``actor``, ``created_by``, ``uploaded_by``, ``cancelled_by``) is
``PROTECT``: deleting a person would have blanked their name on every release and audit
event, which then read as the system's. A person who leaves is deactivated instead; the
Django admin refuses the delete and lists what they did."""

from __future__ import annotations

import json
import secrets

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models.functions import Lower

from registry.domain.choices import (
    ACTIVE_ROLLOUT_STATUSES,
    AuditKind,
    DatasetTask,
    DrillStatus,
    JobKind,
    JobStatus,
    ReleaseAction,
    RolloutStatus,
    VersionStatus,
)
from registry.domain.text import refuse_hidden_characters, refuse_reserved_model_name
from registry.row_lock import locked
from serving.contract import MAX_BATCH_SIZE, MAX_QUEUE_DELAY_S, MAX_WORKER_ID_CHARS


class RegisteredModelQuerySet(models.QuerySet):
    def active(self):
        """Models not archived: what the Models page lists by default."""
        return self.filter(archived_at__isnull=True)

    def tagged(self, tag: str):
        """Models carrying ``tag`` (tags are checked to be plain words, so the JSON text
        holds it quoted exactly once; this works the same on SQLite and PostgreSQL)."""
        return self.filter(tags__icontains=json.dumps(tag))

    def matching(self, text: str):
        """Models whose name, description or a tag contains ``text``."""
        return self.filter(models.Q(name__icontains=text) | models.Q(description__icontains=text) | models.Q(tags__icontains=text))


class RegisteredModel(models.Model):
    name = models.SlugField(max_length=100, unique=True, validators=[refuse_reserved_model_name])
    description = models.TextField(blank=True, validators=[refuse_hidden_characters])
    # Short labels (registry/domain/tags.py says which), for finding models on the Models page.
    tags = models.JSONField(default=list, blank=True)
    # Who answers for the model; the creator unless someone else is named.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="owned_models")
    # Set while archived: hidden from the Models page, nothing routed (registry/actions/catalog.py).
    archived_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    # Batching policy sent to workers with the desired state; null means the default.
    max_batch_size = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(MAX_BATCH_SIZE)])
    max_queue_delay_s = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(MAX_QUEUE_DELAY_S)])
    latency_target_s = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0.0001)])
    # Canary-analysis thresholds for this model's rollouts, over the documented defaults
    # (registry/domain/canary_analysis.py); a rollout's own "analysis" overrides these.
    analysis = models.JSONField(default=dict, blank=True)

    objects = RegisteredModelQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            # "MyModel" and "mymodel" were two models: a client that got the case wrong was
            # answered by the other one (a shape error at best).
            models.UniqueConstraint(Lower("name"), name="registry_model_name_unique_ignoring_case"),
        ]

    def __str__(self) -> str:
        return self.name

    def current_release(self) -> Release | None:
        return self.releases.order_by("-generation").first()

    @property
    def is_archived(self) -> bool:
        return self.archived_at is not None


class VersionQuerySet(models.QuerySet):
    def ready(self):
        """Versions that can be routed."""
        return self.filter(status=VersionStatus.READY)

    def with_artifact(self):
        """Versions whose artifact is in the store: ready ones, and those still being
        validated (a rejected or archived version's bytes are not kept for it)."""
        return self.filter(status__in=(VersionStatus.VALIDATING, VersionStatus.READY))


class ModelVersion(models.Model):
    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64, db_index=True)
    size_bytes = models.BigIntegerField()
    status = models.CharField(max_length=16, choices=VersionStatus.choices, default=VersionStatus.VALIDATING)
    status_reason = models.TextField(blank=True)
    signature = models.JSONField(default=dict)
    opset = models.PositiveIntegerField(null=True, blank=True)
    producer = models.CharField(max_length=200, blank=True)
    validation_report = models.JSONField(default=dict)
    description = models.TextField(blank=True, validators=[refuse_hidden_characters])
    metrics = models.JSONField(default=dict, blank=True)
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    archived_at = models.DateTimeField(null=True, blank=True)

    objects = VersionQuerySet.as_manager()

    class Meta:
        ordering = ["model", "-number"]
        constraints = [models.UniqueConstraint(fields=["model", "number"], name="unique_version_number_per_model")]

    def __str__(self) -> str:
        return f"{self.model.name} v{self.number}"


class ServingGenerationManager(models.Manager):
    def lock(self) -> ServingGeneration:
        """The counter row, locked until the transaction ends (call inside one)."""
        # A migration creates the row; get_or_create covers a flushed test database (a
        # racing insert raises IntegrityError, which get_or_create answers with a get).
        self.get_or_create(pk=1)
        return locked(self.all(), pk=1)  # within DATABASE_LOCK_TIMEOUT_S, however many wait for it


def new_epoch() -> str:
    return secrets.token_hex(8)


class ServingGeneration(models.Model):
    """One row: the generation of the whole desired state, bumped by every traffic change.

    Locking this row serialises all traffic changes, which keeps generations gap-free.
    ``epoch`` names this database's counter: a fresh database gets a new one, so a worker
    that sees a different epoch knows the generation numbers started again.
    """

    generation = models.PositiveBigIntegerField(default=0)
    epoch = models.CharField(max_length=32, default=new_epoch)
    # The counter when a renewal minted ``epoch`` (registry/fleet/workers.py, renew_epoch_past);
    # None for an epoch a fresh database started with.
    epoch_renewed_at = models.PositiveBigIntegerField(null=True, blank=True)

    objects = ServingGenerationManager()


class Release(models.Model):
    """One appended row per traffic change; the history is the audit trail."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="releases")
    generation = models.PositiveBigIntegerField(unique=True)
    routes = models.JSONField()  # [{"version": 3, "weight": 90}, {"version": 4, "weight": 10, ...}]
    stable_version = models.PositiveIntegerField()
    action = models.CharField(max_length=16, choices=ReleaseAction.choices)
    # The release a rollback from this one returns to: walking this chain is "undo".
    rollback_target = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-generation"]
        indexes = [models.Index(fields=["model", "-generation"])]

    def __str__(self) -> str:
        return f"{self.model.name} gen {self.generation}"

    def routed_versions(self) -> list[int]:
        return [route["version"] for route in self.routes]

    @property
    def is_archive(self) -> bool:
        """The model was archived here: no routes, and no place in the desired state."""
        return self.action == ReleaseAction.ARCHIVE


class Drill(models.Model):
    """A timed rollback: when the operator acted, when each worker followed, what failed."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="drills")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=16, choices=DrillStatus.choices, default=DrillStatus.RUNNING)
    roll_forward = models.BooleanField(default=False)
    from_generation = models.PositiveBigIntegerField(null=True, blank=True)
    to_generation = models.PositiveBigIntegerField(null=True, blank=True)
    to_digest = models.CharField(max_length=64, blank=True)  # the content issued as to_generation: what "confirmed" means
    forward_generation = models.PositiveBigIntegerField(null=True, blank=True)  # the roll forward's release, when one was made
    # Asked to roll forward, and nothing has yet made it or ruled it out: set with the
    # rollback, cleared with the outcome. A drill left so by its process (an outage longer
    # than its retries, a console stopped) is rolled forward by ``finish_stale_drills``.
    # db_default: a console still on the code before it (a rolling update) inserts drills without it.
    forward_pending = models.BooleanField(default=False, db_default=False)
    # Workers that followed the rollback but did not confirm the roll forward's content in
    # time: the drill's status is the rollback's, so "passed" alone hid a fleet left split.
    forward_unconfirmed = models.JSONField(default=list, db_default=models.Value([], output_field=models.JSONField()))
    # Workers gone (silent past WORKER_GONE_AFTER_S, under GONE_NOTED_FOR) when the drill
    # started: not waited for, so "passed" says nothing of them; a frozen one still held its port.
    not_measured = models.JSONField(default=list, db_default=models.Value([], output_field=models.JSONField()))
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    first_ack_s = models.FloatField(null=True, blank=True)
    last_ack_s = models.FloatField(null=True, blank=True)
    confirmed_s = models.FloatField(null=True, blank=True)
    failed_requests = models.PositiveBigIntegerField(null=True, blank=True)  # at most serving.contract.MAX_COUNT (drills.failed_sum)
    target_s = models.FloatField()
    # [{"worker", "ack_s", "ok", "error", "note", "confirmed_s", "silent_before_s", "generation", "digest", "model_digest",
    #   "failed_requests", "restarted", "quiet_after_confirming"}]: "model_digest" is the confirming report's digest of the
    #   drilled model; "note" what else failed on a worker that followed; "restarted" "pid A → B" when a new process took
    #   its id meanwhile; "quiet_after_confirming" why its count after confirming is unknown
    workers = models.JSONField(default=list)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            # Drills start under the generation lock, which already keeps this true; the
            # constraint says it where the data lives.
            models.UniqueConstraint(fields=["model"], condition=models.Q(status=DrillStatus.RUNNING), name="one_running_drill_per_model"),
        ]
        # A model's drills are listed newest first by id, a page at a time (api/pagination.Pages).
        indexes = [models.Index(fields=["model", "-id"], name="drills_newest_of_model")]


class Worker(models.Model):
    """The console's view of one serving worker, refreshed by its reports."""

    worker_id = models.CharField(max_length=MAX_WORKER_ID_CHARS, unique=True)
    host = models.CharField(max_length=200)
    pid = models.PositiveIntegerField(null=True)
    url = models.CharField(max_length=300, blank=True)
    device = models.CharField(max_length=50, blank=True)
    generation = models.PositiveBigIntegerField(default=0)
    ok = models.BooleanField(default=True)
    error = models.TextField(blank=True)
    loaded = models.JSONField(default=list)  # [{"model", "version", "warm": bool}]
    last_report = models.JSONField(default=dict)
    key_digest = models.CharField(max_length=64, blank=True)  # sha256 of the key that claimed this id (fleet/worker_keys.py)
    report_allowance = models.FloatField(null=True)  # reports saved up at its last accepted one (fleet/report_rate.py); null: full
    report_allowance_at = models.DateTimeField(null=True)  # when its last report was accepted (acks move last_seen_at too)
    started_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField()

    class Meta:
        ordering = ["worker_id"]


class WorkerAck(models.Model):
    """A worker's answer to one desired-state generation."""

    worker_id = models.CharField(max_length=MAX_WORKER_ID_CHARS)
    generation = models.PositiveBigIntegerField()
    ok = models.BooleanField()
    error = models.TextField(blank=True)
    load_ms = models.FloatField(default=0.0)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["worker_id", "generation"], name="one_ack_per_worker_generation")]


class VersionMetricMinute(models.Model):
    """Per-minute roll-up of what workers reported for one version."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="metric_minutes")
    minute = models.DateTimeField()
    requests = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)  # 5xx
    client_errors = models.PositiveBigIntegerField(default=0)  # 4xx
    latency_sum_s = models.FloatField(default=0.0)
    latency_buckets = models.JSONField(default=dict)  # {"le": count}, cumulative like Prometheus
    batch_size_buckets = models.JSONField(default=dict)

    class Meta:
        ordering = ["minute"]
        constraints = [models.UniqueConstraint(fields=["version", "minute"], name="one_rollup_per_version_minute")]


class ReportSample(models.Model):
    """One worker report's figures for one version, as validated at the boundary: what
    the canary analysis sums over a window. Kept for REPORT_SAMPLE_RETENTION_S."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="report_samples")
    worker_id = models.CharField(max_length=MAX_WORKER_ID_CHARS)
    received_at = models.DateTimeField(db_index=True)
    figures = models.JSONField()

    class Meta:
        indexes = [models.Index(fields=["version", "received_at"])]


class Rollout(models.Model):
    """A rollout plan in progress or finished: the canary walks ``steps`` (percent),
    each judged by the canary analysis every ``interval_s`` and held ``step_duration_s``."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="rollouts")
    canary_version = models.PositiveIntegerField()
    stable_version = models.PositiveIntegerField()
    steps = models.JSONField()  # [1, 10, 50, 100]; a first step of 0 is a shadow step
    shadow_fraction = models.FloatField(default=1.0)  # of stable's requests mirrored to the canary in a shadow step
    step_duration_s = models.FloatField()
    analysis = models.JSONField()  # every threshold, as resolved at the start
    status = models.CharField(max_length=20, choices=RolloutStatus.choices, default=RolloutStatus.RUNNING)
    status_reason = models.TextField(blank=True)
    step_index = models.PositiveIntegerField(default=0)
    step_started_at = models.DateTimeField()
    next_window_at = models.DateTimeField()
    consecutive_failures = models.PositiveIntegerField(default=0)
    windows_judged = models.PositiveIntegerField(default=0)
    # The newest generation this rollout made: a newer release of the model that the
    # rollout did not make is a manual change, which pauses it.
    release_generation = models.PositiveBigIntegerField(default=0)
    forced = models.BooleanField(default=False)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    reason = models.TextField(blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["model"], condition=models.Q(status__in=ACTIVE_ROLLOUT_STATUSES), name="one_active_rollout_per_model"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name} rollout {self.pk} (v{self.canary_version})"

    @property
    def current_weight(self) -> int:
        return self.steps[min(self.step_index, len(self.steps) - 1)]


class RolloutVerdict(models.Model):
    """The analysis of one window of a rollout: the result, every signal with its numbers."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="verdicts")
    number = models.PositiveIntegerField()
    step_index = models.PositiveIntegerField()
    weight = models.PositiveIntegerField()
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    result = models.CharField(max_length=20)  # pass, fail, waiting_for_data
    reason = models.TextField(blank=True)
    signals = models.JSONField(default=list)
    canary = models.JSONField(default=dict)  # the canary's window totals
    stable = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-number"]
        constraints = [models.UniqueConstraint(fields=["rollout", "number"], name="one_verdict_per_rollout_window")]


class EvaluationDataset(models.Model):
    """Labelled examples a model's versions are evaluated on (``.npz`` or ``.jsonl``);
    the file lives at ``registry.jobs.files.dataset_path``."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="datasets")
    name = models.SlugField(max_length=100)
    task = models.CharField(max_length=20, choices=DatasetTask.choices)
    file_format = models.CharField(max_length=8)  # "npz" or "jsonl"
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()
    rows = models.PositiveBigIntegerField()
    description = models.TextField(blank=True, validators=[refuse_hidden_characters])
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model", "name"]
        constraints = [models.UniqueConstraint(fields=["model", "name"], name="unique_dataset_name_per_model")]

    def __str__(self) -> str:
        return f"{self.model.name} data set {self.name}"


class Job(models.Model):
    """One background job (a Celery task ``registry.tasks.run_job``): what it works on,
    where it stands (done / total, rate), and how it ended. ``key`` makes the jobs that
    belong to a version (or a version and a data set) unique, so enqueuing twice is one job."""

    kind = models.CharField(max_length=16, choices=JobKind.choices)
    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="jobs")
    version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.CASCADE, related_name="jobs")
    dataset = models.ForeignKey(EvaluationDataset, null=True, blank=True, on_delete=models.CASCADE, related_name="jobs")
    key = models.CharField(max_length=200, unique=True, null=True, blank=True)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    params = models.JSONField(default=dict, blank=True)
    done = models.PositiveBigIntegerField(default=0)
    total = models.PositiveBigIntegerField(null=True, blank=True)
    rate_per_s = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True)
    input_format = models.CharField(max_length=8, blank=True)
    input_name = models.CharField(max_length=255, blank=True)  # the client's file name, for display
    output_format = models.CharField(max_length=8, blank=True)
    output_bytes = models.BigIntegerField(null=True, blank=True)
    output_removed_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    cancelled_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["model", "-created_at"]), models.Index(fields=["status", "heartbeat_at"]),
            # The jobs API lists a model's jobs newest first by id, filtered by kind or status,
            # a page at a time: without these a page scanned every job of every model.
            models.Index(fields=["model", "-id"], name="jobs_newest_of_model"),
            models.Index(fields=["model", "kind", "-id"], name="jobs_newest_of_kind"),
            models.Index(fields=["model", "status", "-id"], name="jobs_newest_by_status"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name} {self.kind} job {self.pk}"

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate; None while unknown."""
        if self.status != JobStatus.RUNNING or not self.rate_per_s or self.total is None:
            return None
        return max(0.0, (self.total - self.done) / self.rate_per_s)


class AuditEvent(models.Model):
    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="audit_events")
    kind = models.CharField(max_length=32, choices=AuditKind.choices)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    message = models.TextField()
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Newest first as written: ``id`` is unique, so the API's pages of the timeline
        # (registry/api/pagination.py) follow it without ties, as the model page and the CSV do.
        ordering = ["-id"]
        # A page reads the newest rows of one model, filtered or not: without these each
        # page sorted every event of the model, and a rare kind read the whole table.
        indexes = [
            models.Index(fields=["model", "-id"], name="audit_newest_of_model"),
            models.Index(fields=["model", "kind", "-id"], name="audit_newest_of_kind"),
            models.Index(fields=["model", "actor", "-id"], name="audit_newest_by_actor"),
        ]


class InferenceApiKeyQuerySet(models.QuerySet):
    def active(self):
        """Keys that are not revoked."""
        return self.filter(revoked_at__isnull=True)


class InferenceApiKey(models.Model):
    """A client credential for the prediction API. Only the key's sha256 is kept: the
    key itself is shown once, when it is created."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, help_text="The key's first characters, to recognise it.")
    key_sha256 = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = InferenceApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
