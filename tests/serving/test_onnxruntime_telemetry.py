"""ONNX Runtime 1.31 keeps a telemetry queue (session details, errors, a device id) under
``~/.cache/Microsoft/DeveloperTools/.onnxruntime``, outside DATA_DIR; an attacker review
found a worker holding it open. Nothing of ours that runs a model writes it: the
``serving`` and ``registry`` packages turn it off before ONNX Runtime loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]

# A worker's engine on a real model; the registry's own check of a demo model's accuracy
# (manage.py make_demo_models, in the console's environment).
RUNS = {
    "serving": ("from serving.config import ServingConfig; from serving.engine import Engine; "
                "from registry.building.onnx_build import random_mlp, to_bytes; "
                "Engine(to_bytes(random_mlp([4, 2], seed=1)), ServingConfig(), 'cpu')"),
    "registry": ("import numpy as np; from registry.building.demo import onnx_accuracy; "
                 "from registry.building.onnx_build import random_mlp, to_bytes; "
                 "onnx_accuracy(to_bytes(random_mlp([64, 10], seed=1)), np.zeros((3, 64)), np.zeros(3))"),
}


def _environment(tmp_path, home, **settings) -> dict:
    environment = {key: value for key, value in os.environ.items() if key != "ORT_DISABLE_TELEMETRY"}
    environment.update(HOME=str(home), PYTHONPATH=str(REPOSITORY), DJANGO_SETTINGS_MODULE="console.settings",
                       DATA_DIR=str(tmp_path / "data"), **settings)
    environment.pop("XDG_CACHE_HOME", None)
    return environment


@pytest.mark.parametrize("package", sorted(RUNS))
def test_running_a_model_leaves_nothing_in_the_home_directory(tmp_path, package):
    home = tmp_path / "home"
    home.mkdir()

    finished = subprocess.run([sys.executable, "-c", RUNS[package]], cwd=REPOSITORY, env=_environment(tmp_path, home),
                              capture_output=True, text=True, timeout=120)

    assert finished.returncode == 0, finished.stderr[-2000:]
    assert sorted(str(path.relative_to(home)) for path in home.rglob("*")) == []


@pytest.mark.parametrize("package", sorted(RUNS))
def test_an_empty_value_as_compose_writes_it_is_not_set_and_leaves_telemetry_off(tmp_path, package):
    home = tmp_path / "home"
    home.mkdir()

    finished = subprocess.run([sys.executable, "-c", RUNS[package]], cwd=REPOSITORY,
                              env=_environment(tmp_path, home, ORT_DISABLE_TELEMETRY=" "), capture_output=True, text=True, timeout=120)

    assert finished.returncode == 0, finished.stderr[-2000:]
    assert sorted(str(path.relative_to(home)) for path in home.rglob("*")) == []


def test_a_value_that_is_no_true_or_false_word_stops_the_console_naming_it(tmp_path):
    home = tmp_path / "home"
    home.mkdir()

    finished = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPOSITORY,
                              env=_environment(tmp_path, home, ORT_DISABLE_TELEMETRY="banana"), capture_output=True, text=True, timeout=120)

    assert finished.returncode != 0
    assert finished.stderr.strip().splitlines() == [
        "manage.py: ORT_DISABLE_TELEMETRY='banana': expected true or false (one of 1, true, yes, on, 0, false, no, off)"]
