"""Lookups the API views share: the object a URL names, or 404."""

from __future__ import annotations

from django.shortcuts import get_object_or_404

from registry.models import RegisteredModel


def get_model(name: str) -> RegisteredModel:
    return get_object_or_404(RegisteredModel, name=name)
