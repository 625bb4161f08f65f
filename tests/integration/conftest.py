"""Fixtures of the integration tests: real console and worker processes."""

from __future__ import annotations

import io

import httpx
import pytest
from django.conf import settings
from rest_framework.authtoken.models import Token

from registry.actions import uploads
from registry.building.onnx_build import random_mlp, to_bytes
from registry.models import RegisteredModel
from tools.stack import own_database


def registered(name: str, seeds: tuple[int, ...], operator) -> RegisteredModel:
    """Model ``name`` with a version per seed (MLPs of 16 inputs, 4 outputs); the first stable."""
    model = RegisteredModel.objects.create(name=name)
    for seed in seeds:
        uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([16, 8, 4], seed=seed))), uploaded_by=operator)
    return model


@pytest.fixture
def model(operator) -> RegisteredModel:
    """``tiny`` with versions 1 and 2 (different weights); version 1 stable."""
    return registered("tiny", (1, 2), operator)


@pytest.fixture
def api(stack, operator) -> httpx.Client:
    """The live console's API as the operator (needs the test module's ``stack``)."""
    token, _ = Token.objects.get_or_create(user=operator)
    with httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Token {token.key}"}, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def module_database_url(tmp_path_factory) -> str:
    """A new, empty database (SQLite, or PostgreSQL when the suite runs on it) for a stack
    that one module's tests share: they reach it only through the stack's HTTP API, and
    pytest-django's test database would be flushed under the running console. Migrate
    it with the stack (``stack.manage("migrate")``)."""
    with own_database(settings.DATABASES["default"], tmp_path_factory.mktemp("module-database")) as url:
        yield url
