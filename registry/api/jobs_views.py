"""REST API for a model's background jobs: list and submit (batch inference), one job,
its output file, and cancelling it. Operators submit and cancel; every role reads."""

from __future__ import annotations

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.authentication import TokenAuthentication
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.actions import batch_jobs
from registry.api import file_uploads
from registry.api.errors import error_response, error_responses
from registry.api.jobs_serializers import BatchJobRequestSerializer, JobSerializer
from registry.api.lookups import get_model
from registry.api.pagination import PAGE_PARAMETERS, page_of
from registry.api.permissions import IsOperator
from registry.api.streams import file_response
from registry.api.versions_views import HeaderCsrfSessionAuthentication
from registry.committed_change import mark_committed
from registry.domain.choices import JobKind, JobStatus
from registry.jobs import files, records
from registry.models import Job

OUTPUT_CONTENT_TYPES = {"npy": "application/octet-stream", "npz": "application/zip", "jsonl": "application/x-ndjson", "csv": "text/csv"}
FILTERS = [
    OpenApiParameter("kind", str, enum=JobKind.values, description="Only jobs of this kind."),
    OpenApiParameter("status", str, enum=JobStatus.values, description="Only jobs in this state."),
]


def get_job(name: str, job_id: int) -> Job:
    return get_object_or_404(Job.objects.select_related("model", "version", "dataset", "created_by", "cancelled_by"), pk=job_id, model__name=name)


class JobList(APIView):
    parser_classes = [MultiPartParser, FormParser]
    # Authentication and the role check read headers and cookies only; the body (and its
    # file) is parsed in post(), after both have passed.
    authentication_classes = [TokenAuthentication, HeaderCsrfSessionAuthentication]

    @extend_schema(parameters=[*FILTERS, *PAGE_PARAMETERS], responses={200: JobSerializer(many=True), **error_responses(400, 404)},
                   description="The model's jobs, newest first, a page at a time.")
    def get(self, request, name: str):
        jobs = get_model(name).jobs.select_related("model", "version", "dataset", "created_by", "cancelled_by")
        for field, choices in (("kind", JobKind.values), ("status", JobStatus.values)):
            value = request.query_params.get(field)
            if value is None:
                continue
            if value not in choices:
                return error_response(f"{field} must be one of {', '.join(choices)}", status.HTTP_400_BAD_REQUEST)
            jobs = jobs.filter(**{field: value})
        page, pages = page_of(request, jobs, filters=FILTERS)
        return pages.get_paginated_response([records.payload(job) for job in page])

    @extend_schema(
        request={"multipart/form-data": BatchJobRequestSerializer},
        responses={202: JobSerializer, **error_responses(400, 404, 409, 413, 415, 507)},
        description=(
            "Run a ready version (default: the stable version) over a file of inputs, in the background. The file is "
            "streamed to disk and checked (its arrays' headers, or its first row) before a job is queued; a refused file "
            "leaves nothing. Poll the job (or watch the live feed), then download …/jobs/{id}/output."
        ),
    )
    def post(self, request, name: str):
        model = get_model(name)
        limit = settings.JOB_MAX_INPUT_BYTES
        try:
            with file_uploads.staged_files(request, limit):
                form = file_uploads.parse(request, BatchJobRequestSerializer)
                job = batch_jobs.submit(model, form.validated_data["input"], version_number=form.validated_data.get("version"),
                                        batch_size=form.validated_data.get("batch_size"), created_by=request.user)
        except file_uploads.BodyTooLarge:
            return file_uploads.too_large_response(limit, "JOB_MAX_INPUT_BYTES", "the input file")
        except batch_jobs.JobRefused as refusal:
            return error_response(refusal.reason, refusal.status)
        mark_committed(request, f"{model.name}: job {job.pk} queued")
        return Response(records.payload(job), status=status.HTTP_202_ACCEPTED)


class JobDetail(APIView):
    @extend_schema(responses={200: JobSerializer, **error_responses(404)})
    def get(self, request, name: str, job_id: int):
        return Response(records.payload(get_job(name, job_id)))


class OperatorsDownloadOutputs(IsOperator):
    message = "a job's output holds the model's answers on an operator's data: operators and admins download it"


class JobOutput(APIView):
    """The output file of a batch job that succeeded. Viewers read jobs, not the data
    behind them (data sets have no download either)."""

    permission_classes = [OperatorsDownloadOutputs]

    @extend_schema(
        responses={
            **{(200, content_type): OpenApiResponse(bytes, description="The output file, of the input's format family (.npy, .npz, .jsonl or .csv).")
               for content_type in OUTPUT_CONTENT_TYPES.values()},
            **error_responses(404, 409, 410),
        },
        description="404 when the job makes no output file (only batch jobs do), 409 until it has succeeded, 410 once retention removed it.",
    )
    def get(self, request, name: str, job_id: int):
        job = get_job(name, job_id)
        if job.kind != JobKind.BATCH:
            refusal = f"job {job.pk} is a job of kind {job.kind!r}: only batch jobs have an output file"
            return error_response(refusal, status.HTTP_404_NOT_FOUND)
        if job.status != JobStatus.SUCCEEDED:
            return error_response(f"job {job.pk} is {job.status}: its output can be downloaded once it has succeeded", status.HTTP_409_CONFLICT)
        path = files.output_path(job)
        if job.output_removed_at is not None or not path.is_file():
            when = f" on {job.output_removed_at:%Y-%m-%d %H:%M} UTC" if job.output_removed_at else ""
            return error_response(f"the output of job {job.pk} was deleted by retention{when} (JOB_OUTPUT_RETENTION_S)", status.HTTP_410_GONE)
        return file_response(request, path, as_attachment=True, filename=f"{name}-job{job.pk}-output.{job.output_format}",
                            content_type=OUTPUT_CONTENT_TYPES.get(job.output_format, "application/octet-stream"))


class CancelJob(APIView):
    @extend_schema(request=None, responses={202: JobSerializer, **error_responses(404, 409)},
                   description="A queued job is cancelled at once, a running one within a second; 409 when it has finished.")
    def post(self, request, name: str, job_id: int):
        job = get_job(name, job_id)
        if not records.is_finished(job):
            job = records.cancel(job, request.user)
            if job.status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLED):
                return Response(records.payload(job), status=status.HTTP_202_ACCEPTED)
        # Finished before the request, or while it was being cancelled.
        return error_response(f"job {job.pk} has finished ({job.status}): there is nothing to cancel", status.HTTP_409_CONFLICT)
