"""How runstack starts a serving worker: no database URL, no console secret key, and
the worker itself moves into an empty private directory before it loads a model."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from console.embedded_redis import free_port
from console.processes import WORKER_WITHHELD_VARIABLES, wait_http, worker_environment
from registry.building.onnx_build import random_mlp, to_bytes
from serving.contract import DesiredState, ModelState, Route

CODE_TREE = Path(__file__).resolve().parents[2]


def test_worker_environment_withholds_the_database_and_the_secret_key():
    console = {"PATH": "/usr/bin", "DATABASE_URL": "postgres://u:p@db/x", "DATABASE_URL_FILE": "/run/db",
               "DJANGO_SECRET_KEY": "the-real-key", "DJANGO_SECRET_KEY_FILE": "/run/key",
               "SERVING_WORKER_TOKEN": "token", "REDIS_URL": "redis://:pw@r:6379/0"}

    worker = worker_environment(console)

    assert not {"DATABASE_URL", "DATABASE_URL_FILE", "DJANGO_SECRET_KEY_FILE"} & set(worker)
    assert worker["DJANGO_SECRET_KEY"] not in ("the-real-key", worker_environment(console)["DJANGO_SECRET_KEY"])
    assert len(worker["DJANGO_SECRET_KEY"]) >= 50
    assert {name: worker[name] for name in ("PATH", "SERVING_WORKER_TOKEN", "REDIS_URL")} == {
        "PATH": "/usr/bin", "SERVING_WORKER_TOKEN": "token", "REDIS_URL": "redis://:pw@r:6379/0"}
    assert console["DJANGO_SECRET_KEY"] == "the-real-key"  # the console's own copy is untouched


def test_serve_runs_from_an_empty_private_directory_without_console_secrets(tmp_path):
    data = to_bytes(random_mlp([8, 4], seed=0))
    (tmp_path / "model.onnx").write_bytes(data)
    route = Route(version=1, weight=100, sha256=hashlib.sha256(data).hexdigest(), artifact_url=str(tmp_path / "model.onnx"))
    (tmp_path / "state.json").write_text(json.dumps(DesiredState(generation=1, models={"m": ModelState(routes=(route,))}).to_dict()))
    environment = {**os.environ, "DATA_DIR": str(tmp_path / "data"), "DATABASE_URL": "postgres://u:leaked@db/x",
                   "DJANGO_SECRET_KEY": "leaked-" * 10, "SERVING_DEVICE": "cpu", "SERVING_LOG_LEVEL": "warning"}
    port = free_port()
    # Started from tmp_path with a relative state file: serve must resolve it before it moves.
    worker = subprocess.Popen(
        [sys.executable, str(CODE_TREE / "manage.py"), "serve", "--port", str(port), "--state-file", "state.json"],
        cwd=tmp_path, env=worker_environment(environment), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", worker)  # it loaded the model, from the relative state file
        working_directory = Path(os.readlink(f"/proc/{worker.pid}/cwd"))
        names = {entry.split(b"=", 1)[0].decode() for entry in Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0") if entry}
        entries = os.listdir(working_directory)
        mode = stat.S_IMODE(working_directory.stat().st_mode)
    finally:
        worker.terminate()
        worker.wait(timeout=20)

    assert entries == []
    assert mode == 0o700
    assert not working_directory.is_relative_to(CODE_TREE)
    assert working_directory != tmp_path
    assert (set(WORKER_WITHHELD_VARIABLES) - {"DJANGO_SECRET_KEY"}) & names == set()
    assert not (tmp_path / "data" / "secret_key").exists()  # settings never read or made the real key
    assert not working_directory.exists()  # removed when the worker stopped
