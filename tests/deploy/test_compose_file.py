"""docker-compose.yml is a valid Compose file (the Compose Specification's JSON schema,
vendored in schemas/) once interpolated, and refuses to start without its secrets."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.deploy.conftest import COMPOSE_FILE, load_compose, sample_environment
from tests.deploy.consistency import (
    REPO_ROOT,
    MissingVariable,
    interpolate,
    required_variables,
)

SCHEMA = json.loads((Path(__file__).parent / "schemas" / "compose-spec.json").read_text())
ENV_EXAMPLE = REPO_ROOT / ".env.example"
GPU_OVERRIDE = REPO_ROOT / "deploy" / "compose" / "gpu.yml"
SECRETS = {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "DJANGO_SECRET_KEY", "SERVING_WORKER_TOKEN", "CONSOLE_METRICS_TOKEN", "GRAFANA_ADMIN_PASSWORD"}


def schema_errors(document: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(document)]


def test_the_compose_file_follows_the_compose_specification(compose):
    assert schema_errors(compose) == []


def test_the_gpu_override_follows_the_compose_specification():
    assert schema_errors(load_compose(GPU_OVERRIDE, sample_environment(COMPOSE_FILE.read_text()))) == []


def test_the_schema_check_refuses_a_misplaced_key(compose):
    broken = copy.deepcopy(compose)
    broken["services"]["worker"]["replicas"] = 2  # belongs under deploy:

    assert any("replicas" in error for error in schema_errors(broken))


def test_every_secret_is_required_without_a_default():
    assert required_variables(COMPOSE_FILE.read_text()) >= SECRETS


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_compose_refuses_to_start_while_a_secret_is_unset_or_empty(secret):
    text = COMPOSE_FILE.read_text()
    environment = sample_environment(text)

    for missing in ({k: v for k, v in environment.items() if k != secret}, {**environment, secret: ""}):
        with pytest.raises(MissingVariable) as refused:
            interpolate(yaml.safe_load(text), missing)
        assert refused.value.name == secret


def test_the_env_example_names_every_required_variable_with_an_empty_value():
    lines = [line for line in ENV_EXAMPLE.read_text().splitlines() if line and not line.startswith("#")]
    assigned = dict(line.split("=", 1) for line in lines)

    assert set(assigned) == required_variables(COMPOSE_FILE.read_text())
    assert all(value == "" for value in assigned.values()), "no secret ships with a value"


def test_the_env_example_says_how_to_generate_the_secrets():
    text = ENV_EXAMPLE.read_text()

    assert "secrets.token_hex" in text
    assert re.search(r"^#.*cp \.env\.example \.env", text, re.MULTILINE)


def test_the_env_file_is_kept_out_of_git_and_of_the_build_context():
    docker_ignored = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    git_ignored = (REPO_ROOT / ".gitignore").read_text().splitlines()

    assert ".env" in docker_ignored and "!.env.example" in docker_ignored
    assert ".env" in git_ignored
