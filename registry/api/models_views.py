"""REST API for registered models: list (searched, filtered), create, read, change,
archive and restore."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import exceptions, generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.actions import catalog
from registry.api import pagination, serializers
from registry.api.errors import error_response, error_responses
from registry.api.lookups import get_model
from registry.api.parsers import JSONParser
from registry.committed_change import mark_committed
from registry.models import RegisteredModel

LIST_PARAMETERS = [
    OpenApiParameter("q", str, description="Only models whose name, description or a tag contains this text (any case)."),
    OpenApiParameter("tag", str, description="Only models carrying this tag."),
    OpenApiParameter("owner", str, description="Only models owned by this username."),
    OpenApiParameter("archived", OpenApiTypes.BOOL, description="true: only archived models; false: only the others. All when absent."),
]
ARCHIVED_VALUES = {"true": True, "false": False}


def filtered_models(params) -> QuerySet[RegisteredModel]:
    """The models the list's query parameters ask for; a bad ``archived`` is a 400, and so
    is a NUL character, which PostgreSQL refuses in a text parameter (the query would fail)."""
    for name in ("q", "tag", "owner"):
        if "\x00" in params.get(name, ""):
            raise exceptions.ValidationError({name: ["must not contain NUL (\\u0000) characters"]})
    models = RegisteredModel.objects.select_related("created_by", "owner")
    if params.get("q"):
        models = models.matching(params["q"])
    if params.get("tag"):
        models = models.tagged(params["tag"])
    if params.get("owner"):
        models = models.filter(owner__username=params["owner"])
    if "archived" in params:
        if params["archived"] not in ARCHIVED_VALUES:
            raise exceptions.ValidationError({"archived": ["must be true or false"]})
        models = models.filter(archived_at__isnull=not ARCHIVED_VALUES[params["archived"]])
    return models


@extend_schema_view(
    get=extend_schema(parameters=[*LIST_PARAMETERS, *pagination.PAGE_PARAMETERS],
                      responses={200: serializers.ModelSerializer(many=True), **error_responses(400)}),
    post=extend_schema(request=serializers.ModelCreateSerializer, responses={201: serializers.ModelSerializer, **error_responses(400, 409, 415)}),
)
class ModelList(generics.ListCreateAPIView):
    parser_classes = [JSONParser]  # nullable numbers have no form spelling
    pagination_class = pagination.ByName
    query_filters = LIST_PARAMETERS

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator has no request
            return RegisteredModel.objects.none()
        return filtered_models(self.request.query_params)

    def get_serializer_class(self):
        return serializers.ModelCreateSerializer if self.request.method == "POST" else serializers.ModelSerializer

    def create(self, request, *args, **kwargs):
        form = serializers.ModelCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = dict(form.validated_data)
        owner = data.pop("owner", catalog.UNSET)
        try:
            model = catalog.create_model(created_by=request.user, owner=owner, **data)
        except catalog.CatalogError as error:
            return error_response(error.message, error.status, fields={"name": [error.message]})
        mark_committed(request, f"model {model.name} created")
        return Response(serializers.ModelSerializer(model).data, status=status.HTTP_201_CREATED)


@extend_schema_view(
    get=extend_schema(responses={200: serializers.ModelSerializer, **error_responses(404)}),
    patch=extend_schema(request=serializers.ModelUpdateSerializer, responses={200: serializers.ModelSerializer, **error_responses(400, 404, 415)}),
)
class ModelDetail(generics.RetrieveUpdateAPIView):
    queryset = RegisteredModel.objects.all()
    lookup_field = "name"
    parser_classes = [JSONParser]
    http_method_names = ["get", "patch", "head", "options"]

    def get_serializer_class(self):
        return serializers.ModelUpdateSerializer if self.request.method == "PATCH" else serializers.ModelSerializer

    def update(self, request, *args, **kwargs):
        model = self.get_object()
        form = serializers.ModelUpdateSerializer(model, data=request.data, partial=True)
        form.is_valid(raise_exception=True)
        model = catalog.change_model(model, request.user, **form.validated_data)
        return Response(serializers.ModelSerializer(model).data)


class _ArchiveAction(APIView):
    parser_classes = [JSONParser]
    change = None  # catalog.archive or catalog.unarchive

    def post(self, request, name: str):
        model = get_model(name)
        form = serializers.ArchiveSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            model = type(self).change(model, request.user, form.validated_data["reason"])[0]
        except catalog.CatalogError as error:
            return error_response(error.message, error.status)
        return Response(serializers.ModelSerializer(model).data)


@extend_schema(
    request=serializers.ArchiveSerializer, responses={200: serializers.ModelSerializer, **error_responses(400, 404, 409, 415)},
    description=("Archive the model: hidden from the console's Models page (unless asked for), no uploads, no traffic changes, "
                 "drills or rollouts (409). A served model stops serving: a release with action `archive` and no routes is appended "
                 "(`current_release` in the answer), the model leaves the desired state and workers unload it; its running rollout "
                 "is aborted. 409 when it is archived already. Recorded in the audit timeline."),
)
class ArchiveModel(_ArchiveAction):
    change = staticmethod(catalog.archive)


@extend_schema(
    request=serializers.ArchiveSerializer, responses={200: serializers.ModelSerializer, **error_responses(400, 404, 409, 415)},
    description=("Restore an archived model (409 when it is not archived). A model archived while served gets back the routes it served "
                 "before, in a new release (action `restore`, `current_release` in the answer); when a version of those is no longer "
                 "ready it serves nothing until a version is routed. Recorded in the audit timeline."),
)
class UnarchiveModel(_ArchiveAction):
    change = staticmethod(catalog.unarchive)
