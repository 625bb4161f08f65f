"""The demo digits versions: real training, exported to ONNX, served by ORT."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from registry.artifacts.inspection import inspect_artifact
from registry.building.demo import (
    build_demo_versions,
    demo_model_description,
    demo_model_name,
    demo_test_split,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SHA256_OF_BUILD = (
    "import hashlib; from registry.building.demo import build_demo_versions; "
    "print(' '.join(hashlib.sha256(v.artifact).hexdigest() for v in build_demo_versions()))"
)


@pytest.fixture(scope="module")
def versions():
    return build_demo_versions()


def sha256s(versions) -> list[str]:
    return [hashlib.sha256(version.artifact).hexdigest() for version in versions]


def test_two_versions_with_complete_metrics(versions):
    assert demo_model_name == "digits"
    assert "raw pixel" in demo_model_description
    assert len(versions) == 2
    for version in versions:
        assert set(version.metrics) >= {"accuracy", "dataset", "test_samples", "train_samples", "family"}
        assert version.metrics["dataset"] == "sklearn digits 8x8"
        assert version.metrics["test_samples"] == 450
        assert "0..16" in version.metrics["input_scaling"] and "0..16" in version.description
    assert [version.metrics["train_samples"] for version in versions] == [100, 1347]


def test_v2_is_clearly_more_accurate_than_v1(versions):
    v1_accuracy, v2_accuracy = (version.metrics["accuracy"] for version in versions)

    assert 0.85 <= v1_accuracy <= 0.92
    assert 0.96 <= v2_accuracy <= 0.99
    assert v2_accuracy - v1_accuracy >= 0.05


def test_accuracy_is_the_served_models_on_raw_pixels(versions):
    pixels, labels = demo_test_split()
    assert pixels.max() == 16  # raw pixels, no client-side scaling

    for version in versions:
        session = onnxruntime.InferenceSession(version.artifact, providers=["CPUExecutionProvider"])
        (probabilities,) = session.run(["probabilities"], {"input": pixels.astype(np.float32)})
        assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
        accuracy = float(np.mean(probabilities.argmax(axis=1) == labels))
        assert version.metrics["accuracy"] == round(accuracy, 4)


def test_bytes_are_identical_across_processes(versions):
    builds = [
        subprocess.run([sys.executable, "-c", SHA256_OF_BUILD], cwd=PROJECT_ROOT, capture_output=True, text=True,
                       check=True, timeout=120).stdout.split()
        for _ in range(2)
    ]

    assert builds[0] == builds[1] == sha256s(versions)
    assert len(set(builds[0])) == 2


def test_both_versions_pass_inspection_with_the_contract_signature(versions, tmp_path):
    for number, version in enumerate(versions, start=1):
        path = tmp_path / f"digits-v{number}.onnx"
        path.write_bytes(version.artifact)

        result = inspect_artifact(path)

        assert result.signature == {
            "inputs": [{"name": "input", "datatype": "FP32", "shape": ["batch", 64]}],
            "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": ["batch", 10]}],
            "opset": 17,
            "producer": "modelops-console",
            "batchable": True,
        }
