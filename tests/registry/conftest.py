from __future__ import annotations

import hashlib
import io

import pytest

from registry import uploads
from registry.inspection import inspect_artifact
from registry.models import RegisteredModel
from registry.onnx_build import random_mlp, to_bytes

_REPORTS: dict[str, object] = {}


def _remembered_inspection(path, **limits):
    """The real child-process inspection, run once per distinct artifact per session:
    the same bytes always give the same report, and this keeps the suite quick."""
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if digest not in _REPORTS:
        _REPORTS[digest] = inspect_artifact(path, **limits)
    return _REPORTS[digest]


@pytest.fixture
def three_versions(db, operator, monkeypatch) -> RegisteredModel:
    """Model ``digits`` with versions 1..3; version 1 is stable at 100%."""
    monkeypatch.setattr(uploads, "inspect_artifact", _remembered_inspection)
    model = RegisteredModel.objects.create(name="digits")
    for seed in range(3):
        uploads.register_stream(model, io.BytesIO(to_bytes(random_mlp([8, 4], seed=seed))), uploaded_by=operator)
    return model
