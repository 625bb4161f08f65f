"""The API's shape of jobs and evaluation data sets. A job is answered with
``records.payload`` (the same dict the live feed sends); ``JobSerializer`` documents it."""

from __future__ import annotations

from rest_framework import serializers

from registry.api.request_keys import RefusesUnknownKeys
from registry.api.serializers import DESCRIPTION_MAX_CHARS, UserNameField
from registry.domain.choices import DatasetTask, JobKind, JobStatus
from registry.domain.text import refuse_hidden_characters
from registry.jobs.batch import MAX_BATCH_SIZE
from registry.models import EvaluationDataset


class JobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.ChoiceField(JobKind.choices)
    model = serializers.CharField(help_text="The model's name.")
    version = serializers.IntegerField(allow_null=True, help_text="The version number the job runs, if any.")
    dataset = serializers.CharField(allow_null=True, help_text="The data set an evaluation runs on.")
    status = serializers.ChoiceField(JobStatus.choices)
    done = serializers.IntegerField(help_text="Rows (or steps) done so far.")
    total = serializers.IntegerField(allow_null=True, help_text="Rows (or steps) in all, once known.")
    rate_per_s = serializers.FloatField(allow_null=True)
    eta_s = serializers.FloatField(allow_null=True, help_text="Seconds left at the current rate, while running.")
    error = serializers.CharField(allow_blank=True, help_text="Why the job failed or was cancelled.")
    result = serializers.DictField(help_text="What the job measured or produced, once it succeeded.")
    params = serializers.DictField(help_text="The job's parameters, e.g. batch_size.")
    input_format = serializers.CharField(allow_blank=True)
    input_name = serializers.CharField(allow_blank=True, help_text="The uploaded file's name, for display.")
    output_format = serializers.CharField(allow_blank=True)
    output_bytes = serializers.IntegerField(allow_null=True)
    output_available = serializers.BooleanField(help_text="The output file can be downloaded from …/jobs/{id}/output.")
    attempts = serializers.IntegerField()
    cancel_requested = serializers.BooleanField()
    created_by = serializers.CharField(allow_null=True, help_text="Who submitted it (null: the system, e.g. a benchmark after validation).")
    cancelled_by = serializers.CharField(allow_null=True, help_text="Who asked to cancel it, if anyone did.")
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class BatchJobRequestSerializer(RefusesUnknownKeys, serializers.Serializer):
    input = serializers.FileField(help_text="The inputs: .npy, .npz (arrays named by the model's inputs), .jsonl or .csv.")
    version = serializers.IntegerField(required=False, min_value=1, help_text="The ready version to run; default: the stable version.")
    batch_size = serializers.IntegerField(required=False, min_value=1, max_value=MAX_BATCH_SIZE,
                                          help_text="Rows per model call; default BATCH_JOB_BATCH_SIZE.")


class DatasetSerializer(serializers.ModelSerializer):
    created_by = UserNameField(read_only=True)

    class Meta:
        model = EvaluationDataset
        fields = ["name", "task", "file_format", "sha256", "size_bytes", "rows", "description", "created_by", "created_at"]


class DatasetRequestSerializer(RefusesUnknownKeys, serializers.Serializer):
    file = serializers.FileField(help_text=".npz (the model's input arrays and 'labels') or .jsonl (one object per row, inputs and 'label').")
    name = serializers.SlugField(max_length=100)
    task = serializers.ChoiceField(DatasetTask.choices)
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=DESCRIPTION_MAX_CHARS,
                                        validators=[refuse_hidden_characters])
