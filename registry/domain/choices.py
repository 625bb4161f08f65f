"""Status values, reused by models, API and UI badges."""

from django.db import models


class VersionStatus(models.TextChoices):
    VALIDATING = "validating", "Validating"
    READY = "ready", "Ready"
    REJECTED = "rejected", "Rejected"
    ARCHIVED = "archived", "Archived"


class ReleaseAction(models.TextChoices):
    INITIAL = "initial", "First version routed"
    SET_ROUTES = "set_routes", "Traffic split changed"
    PROMOTE = "promote", "Canary promoted"
    ROLLBACK = "rollback", "Rolled back"
    RESTORE = "restore", "Earlier release restored"
    ARCHIVE = "archive", "Archived: serves nothing"


class AuditKind(models.TextChoices):
    MODEL_CREATED = "model_created", "Model registered"
    MODEL_CHANGED = "model_changed", "Model details changed"
    MODEL_ARCHIVED = "model_archived", "Model archived"
    MODEL_RESTORED = "model_restored", "Model restored from the archive"
    VERSION_UPLOADED = "version_uploaded", "Version uploaded"
    VERSION_CHANGED = "version_changed", "Version description changed"
    UPLOAD_REFUSED = "upload_refused", "Upload refused"
    VERSION_ARCHIVED = "version_archived", "Version archived"
    RELEASE = "release", "Traffic changed"
    DRILL = "drill", "Rollback drill"
    ROLLOUT = "rollout", "Rollout"
    DATASET_ADDED = "dataset_added", "Evaluation data set added"
    JOB = "job", "Job"


class DrillStatus(models.TextChoices):
    RUNNING = "running", "Running"
    PASSED = "passed", "Passed"
    FAILED = "failed", "Failed"
    ERROR = "error", "Error"


class RolloutStatus(models.TextChoices):
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    WAITING_FOR_DATA = "waiting_for_data", "Waiting for data"
    PROMOTED = "promoted", "Promoted"
    ROLLED_BACK = "rolled_back", "Rolled back"
    ABORTED = "aborted", "Aborted"


# A rollout in one of these still owns its model's traffic: at most one per model.
ACTIVE_ROLLOUT_STATUSES = (RolloutStatus.RUNNING, RolloutStatus.PAUSED, RolloutStatus.WAITING_FOR_DATA)
# The analysis judges a window only in these (a paused rollout waits for the operator).
ANALYSED_ROLLOUT_STATUSES = (RolloutStatus.RUNNING, RolloutStatus.WAITING_FOR_DATA)


class JobKind(models.TextChoices):
    VALIDATION = "validation", "Validation"
    BENCHMARK = "benchmark", "Benchmark"
    EVALUATION = "evaluation", "Evaluation"
    BATCH = "batch", "Batch inference"


class JobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


# A job in one of these is finished: nothing runs it again.
TERMINAL_JOB_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class DatasetTask(models.TextChoices):
    CLASSIFICATION = "classification", "Classification"
    REGRESSION = "regression", "Regression"
