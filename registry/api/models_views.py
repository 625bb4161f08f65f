"""REST API for registered models: list, create, read."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, status
from rest_framework.parsers import JSONParser
from rest_framework.response import Response

from registry.actions import events
from registry.api import serializers
from registry.api.errors import error_responses
from registry.models import RegisteredModel


@extend_schema_view(
    get=extend_schema(responses={200: serializers.ModelSerializer(many=True), **error_responses()}),
    post=extend_schema(request=serializers.ModelCreateSerializer, responses={201: serializers.ModelSerializer, **error_responses(400, 415)}),
)
class ModelList(generics.ListCreateAPIView):
    queryset = RegisteredModel.objects.all()
    parser_classes = [JSONParser]  # nullable numbers have no form spelling

    def get_serializer_class(self):
        return serializers.ModelCreateSerializer if self.request.method == "POST" else serializers.ModelSerializer

    def perform_create(self, serializer):
        model = serializer.save(created_by=self.request.user)
        events.model_created(model, self.request.user)

    def create(self, request, *args, **kwargs):
        super().create(request, *args, **kwargs)
        model = RegisteredModel.objects.get(name=request.data["name"])
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
        super().update(request, *args, partial=True)
        return Response(serializers.ModelSerializer(self.get_object()).data)
