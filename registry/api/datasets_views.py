"""REST API for a model's evaluation data sets: list, add (every ready version is then
evaluated on it, in the background), read one."""

from __future__ import annotations

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.authentication import TokenAuthentication
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.actions import datasets
from registry.api import file_uploads
from registry.api.errors import error_response, error_responses
from registry.api.jobs_serializers import DatasetRequestSerializer, DatasetSerializer
from registry.api.lookups import get_model
from registry.api.pagination import PAGE_PARAMETERS, ByName, page_of
from registry.api.versions_views import HeaderCsrfSessionAuthentication
from registry.committed_change import mark_committed
from registry.models import EvaluationDataset


class DatasetList(APIView):
    parser_classes = [MultiPartParser, FormParser]
    # As for uploads: the body (and its file) is parsed only after the role check.
    authentication_classes = [TokenAuthentication, HeaderCsrfSessionAuthentication]

    @extend_schema(parameters=PAGE_PARAMETERS, responses={200: DatasetSerializer(many=True), **error_responses(400, 404)})
    def get(self, request, name: str):
        page, pages = page_of(request, get_model(name).datasets.select_related("created_by"), ByName)
        return pages.get_paginated_response(DatasetSerializer(page, many=True).data)

    @extend_schema(
        request={"multipart/form-data": DatasetRequestSerializer},
        responses={201: DatasetSerializer, **error_responses(400, 404, 409, 413, 415, 507)},
        description=(
            "Add a labelled data set. The file is streamed to disk and checked (every row of a .jsonl, the arrays of an "
            ".npz) before anything is kept; a refused file leaves nothing. Every ready version is then evaluated on it in "
            "the background (jobs of kind 'evaluation'); 409 when the model has a data set of that name."
        ),
    )
    def post(self, request, name: str):
        model = get_model(name)
        limit = settings.DATASET_MAX_BYTES
        try:
            with file_uploads.staged_files(request, limit):
                form = file_uploads.parse(request, DatasetRequestSerializer)
                dataset = datasets.add(model, form.validated_data["file"], name=form.validated_data["name"], task=form.validated_data["task"],
                                       description=form.validated_data["description"], created_by=request.user)
        except file_uploads.BodyTooLarge:
            return file_uploads.too_large_response(limit, "DATASET_MAX_BYTES", "the data set")
        except datasets.DatasetRefused as refusal:
            return error_response(refusal.reason, refusal.status)
        mark_committed(request, f"{model.name}: data set {dataset.name!r} added")
        return Response(DatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)


class DatasetDetail(APIView):
    @extend_schema(responses={200: DatasetSerializer, **error_responses(404)})
    def get(self, request, name: str, dataset: str):
        found = get_object_or_404(EvaluationDataset.objects.select_related("created_by"), model__name=name, name=dataset)
        return Response(DatasetSerializer(found).data)
