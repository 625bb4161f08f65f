"""The Dockerfile builds what the processes need and nothing else: pinned bases, runtime
requirements only, the code the commands read, the binaries the code runs, a non-root user."""

from __future__ import annotations

import re

import pytest

from tests.deploy.consistency import REPO_ROOT, takes_console_http_options

DOCKERFILE = REPO_ROOT / "Dockerfile"
TARGETS = ("runtime", "cuda")
# What the processes read at run time: the commands' code, the templates, static files.
NEEDED_AT_RUN_TIME = ("manage.py", "console", "serving", "registry", "templates", "static")
# Programs the code runs (registry/jobs/child.py, registry/artifacts/inspection.py).
BINARIES = ("setpriv", "prlimit", "nice")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def stages() -> dict[str, list[tuple[str, str]]]:
    result, current = {}, None
    for keyword, rest in instructions():
        if keyword == "FROM":
            current = rest.split()[-1] if " AS " in rest.upper() else rest
            result[current] = []
        elif current is not None:
            result[current].append((keyword, rest))
    return result


def arguments() -> dict[str, str]:
    return dict(rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG" and "=" in rest)


def base_images() -> list[str]:
    images = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            image = rest.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}", lambda match: arguments()[match.group(1)], image))
    return images


def test_the_default_target_is_the_cpu_runtime():
    assert list(stages())[-1] == "runtime"


def test_every_base_image_is_pinned_to_an_exact_version():
    external = [image for image in base_images() if image not in stages() and image != "scratch"]

    assert external and all(re.fullmatch(r"[a-z0-9./-]+:[0-9]+\.[0-9]+\.[0-9]+[a-z0-9.-]*", image) for image in external), external


def test_the_python_of_the_image_is_the_projects():
    import sys

    python = arguments()["PYTHON_IMAGE"]

    assert python.startswith(f"python:{sys.version_info.major}.{sys.version_info.minor}.")


def test_the_cuda_target_has_cudnn_for_onnxruntime_gpu():
    assert re.fullmatch(r"nvidia/cuda:12\.[0-9.]+-cudnn-runtime-ubuntu[0-9.]+", arguments()["CUDA_IMAGE"])
    assert "onnxruntime-gpu==" in (REPO_ROOT / "requirements.txt").read_text()


def test_only_the_runtime_requirements_are_installed():
    text = DOCKERFILE.read_text()

    assert "requirements.txt" in text and "requirements-test" not in text


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_runs_as_a_fixed_unprivileged_user(target):
    users = [rest for keyword, rest in stages()[target] if keyword == "USER"]

    assert users and re.fullmatch(r"[1-9][0-9]{3,}(:[1-9][0-9]{3,})?", users[-1])


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_has_a_health_check_and_the_binaries_the_code_runs(target):
    steps = stages()[target]
    installs = " ".join(rest for keyword, rest in steps if keyword == "RUN")

    assert any(keyword == "HEALTHCHECK" for keyword, _ in steps)
    assert "util-linux" in installs and "coreutils" in installs
    assert all(f"command -v {binary}" in installs for binary in BINARIES)


@pytest.mark.parametrize("target", TARGETS)
def test_each_targets_console_takes_the_http_options_make_run_gives_it(target):
    import json

    argv = json.loads(next(rest for keyword, rest in stages()[target] if keyword == "CMD"))
    assert takes_console_http_options(argv), argv


def test_the_code_the_child_processes_run_names_those_binaries():
    code = (REPO_ROOT / "registry/jobs/child.py").read_text()

    assert all(f'"{binary}"' in code for binary in BINARIES)


def test_every_copied_path_exists_and_the_commands_code_is_copied():
    copied = []
    for keyword, rest in instructions():
        if keyword == "COPY" and "--from=" not in rest:
            copied += rest.split()[:-1]

    assert [path for path in copied if not (REPO_ROOT / path).exists()] == []
    assert set(NEEDED_AT_RUN_TIME) <= set(copied)


def test_the_build_context_leaves_out_local_environments_data_and_history():
    ignored = set((REPO_ROOT / ".dockerignore").read_text().splitlines())

    assert {".git", ".venv", "test-artifacts", "var", "data", "tests"} <= ignored
    assert not ignored & set(NEEDED_AT_RUN_TIME)
