"""The worker's own check of what it loads: external data anywhere in a file is refused
before ONNX Runtime sees the bytes, whatever the console said about the file."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from serving_testkit import route, state

from registry.building.onnx_build import to_bytes
from serving import engine as engine_module
from serving.config import ServingConfig
from serving.engine import Engine
from serving.model_safety import (
    UnsafeModel,
    check_model_bytes,
    default_data_dir,
    enter_private_working_directory,
    external_references,
)
from serving.protocol import Decoded
from tests.fixtures.onnx_files import (
    ESCAPING_LOCATION,
    EXTERNAL_DATA_PLACES,
    build_external_entry_without_the_flag,
    build_multi_input,
    make_model,
    point_at_external_data,
)

SECRET = b"the-console-secret-key-0123456789"
CODE_TREE = Path(__file__).resolve().parents[2]


@pytest.fixture
def secret_in_cwd(tmp_path, monkeypatch) -> str:
    """A working directory holding a file a hostile model names, as var/secret_key was."""
    (tmp_path / "secret.bin").write_bytes(SECRET)
    monkeypatch.chdir(tmp_path)
    return "secret.bin"


def test_plain_onnx_runtime_serves_a_file_named_by_external_data(secret_in_cwd):
    # The threat itself: loaded from bytes, ORT resolves the reference against the cwd.
    leak = numpy_helper.from_array(np.zeros(len(SECRET), np.uint8), "leak")
    point_at_external_data(leak, secret_in_cwd)
    output = helper.make_tensor_value_info("y", TensorProto.UINT8, [len(SECRET)])
    model = make_model([helper.make_node("Identity", ["leak"], ["y"])], [], [output], initializers=[leak])

    session = ort.InferenceSession(to_bytes(model), providers=["CPUExecutionProvider"])

    assert bytes(session.run(None, {})[0]) == SECRET


@pytest.mark.parametrize("place", sorted(EXTERNAL_DATA_PLACES))
def test_walk_sees_external_data_in_every_place(place):
    assert [location for _, location in external_references(EXTERNAL_DATA_PLACES[place]())] == [ESCAPING_LOCATION]


@pytest.mark.parametrize("place", sorted(EXTERNAL_DATA_PLACES))
def test_engine_refuses_external_data_before_onnx_runtime_sees_it(place, secret_in_cwd, monkeypatch):
    sessions = []
    monkeypatch.setattr(engine_module.ort, "InferenceSession", lambda *args, **kwargs: sessions.append(args))

    with pytest.raises(UnsafeModel) as caught:
        Engine(to_bytes(EXTERNAL_DATA_PLACES[place](location=secret_in_cwd)), ServingConfig(device="cpu"), "cpu")

    assert f"points at external data '{secret_in_cwd}'" in caught.value.reason
    assert sessions == []


def write_artifact(directory: Path, name: str, data: bytes) -> tuple[Path, str]:
    path = directory / f"{name}.onnx"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


async def test_worker_asked_to_load_a_hostile_file_refuses_and_keeps_serving(repository, mlp_v1, tmp_path, secret_in_cwd):
    await repository.apply(state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}))
    table = repository.router.table
    hostile = write_artifact(tmp_path, "hostile", to_bytes(EXTERNAL_DATA_PLACES["function-attribute-default"](location=secret_in_cwd)))

    result = await repository.apply(state(2, {"digits": {"routes": [route(1, 0, *mlp_v1), route(2, 100, *hostile)]}}))

    assert result["ok"] is False
    assert result["error"].startswith("applied but for digits (keeps the routes it served before): "
                                      "digits v2: refused to load the model: tensor 'bias' points at external data 'secret.bin'")
    assert repository.router.table is table
    assert repository.generation == 1
    assert set(repository.loaded) == {("digits", 1)}
    target = repository.router.table.resolve("digits", None)
    await target.submit(Decoded((np.zeros((1, 64), np.float32),), 1), time.monotonic() + 5, "test")
    assert target.version == 1


def test_a_tensor_naming_an_external_file_is_refused_though_its_flag_says_its_bytes_are_inside():
    # The flag and the entries are two fields a reader may go by: ONNX Runtime reads this
    # file from its own bytes today; one that trusted the entries would open the named file.
    data = to_bytes(build_external_entry_without_the_flag(location="/etc/hostname"))

    with pytest.raises(UnsafeModel) as caught:
        check_model_bytes(data)

    assert caught.value.reason == ("tensor 'W0' points at external data '/etc/hostname'; external data files are not accepted, "
                                   "store every tensor inside the .onnx file")


def test_unreadable_bytes_are_refused_rather_than_passed_on():
    with pytest.raises(UnsafeModel) as caught:
        check_model_bytes(b"not a model")

    assert caught.value.reason.startswith("not a readable ONNX model (")


def test_fields_this_onnx_does_not_know_are_refused():
    # Field 127 of ModelProto: unknown here, so nothing can say what a reader does with it.
    data = to_bytes(build_multi_input()) + bytes([0xF8, 0x07, 0x01])

    with pytest.raises(UnsafeModel) as caught:
        check_model_bytes(data)

    assert "fields unknown to ONNX" in caught.value.reason


def test_node_that_names_a_file_of_its_own_is_refused():
    model = build_multi_input()
    model.graph.node.append(helper.make_node("EPContext", [], [], domain="com.microsoft", embed_mode=0,
                                             ep_cache_context="../var/secret_key"))

    with pytest.raises(UnsafeModel) as caught:
        check_model_bytes(to_bytes(model))

    assert "(EPContext) refers to a file outside the model" in caught.value.reason


def test_a_model_that_onnx_runtime_would_read_as_its_ort_format_is_refused():
    model = build_multi_input()
    model.producer_name = "ORTM-shaped"  # serialised right after ir_version: bytes 4 to 8
    data = to_bytes(model)
    assert data[4:8] == b"ORTM"

    with pytest.raises(UnsafeModel) as caught:
        check_model_bytes(data)

    assert "read this file as its ORT format" in caught.value.reason


def test_clean_model_passes_the_check():
    check_model_bytes(to_bytes(build_multi_input()))


# ---------------------------------------------------------------- where model-loading processes run


def test_data_dir_defaults_outside_the_code_tree(monkeypatch, tmp_path):
    monkeypatch.delenv("DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "modelops"

    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_dir() == tmp_path / "home" / ".local" / "share" / "modelops"

    monkeypatch.setenv("DATA_DIR", str(tmp_path / "explicit"))
    assert default_data_dir() == tmp_path / "explicit"


def test_worker_cache_defaults_under_the_data_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("SERVING_CACHE_DIR", raising=False)
    monkeypatch.setenv("DATA_DIR", str(tmp_path))

    assert ServingConfig.from_env().cache_dir == str(tmp_path / "serving-cache")


def test_private_working_directory_is_fresh_empty_and_ours(monkeypatch):
    monkeypatch.chdir(CODE_TREE)  # restored afterwards

    directory = enter_private_working_directory()

    assert Path(os.getcwd()) == directory
    assert os.listdir(directory) == []
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert not directory.is_relative_to(CODE_TREE)
    os.chdir(CODE_TREE)
    directory.rmdir()
