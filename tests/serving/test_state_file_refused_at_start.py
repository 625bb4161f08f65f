"""A state file that reads as JSON but cannot be served (no contract, another contract
version, a model file that is not there) is the operator's to fix: `python -m
serving.worker` says so in one JSON line naming the file and why, and exits 2 before it
listens, as for a file it cannot read. It was a traceback inside a lifespan log line, then exit 3."""

from __future__ import annotations

import json
import subprocess
import sys

import orjson
import pytest
from serving_testkit import REPO_ROOT, free_port

from serving.contract import CONTRACT_VERSION


def hand_written_state(artifact_url: str, contract: int = CONTRACT_VERSION) -> dict:
    route = {"version": 1, "weight": 100, "sha256": "0" * 64, "artifact_url": artifact_url}
    return {"contract": contract, "generation": 1, "models": {"digits": {"routes": [route]}}}


UNSERVABLE = {
    "no contract": (lambda tmp_path: {}, f"speaks contract {CONTRACT_VERSION}, the message names none"),
    "another contract version": (lambda tmp_path: hand_written_state(str(tmp_path / "model.onnx"), CONTRACT_VERSION + 1),
                                 f"speaks contract {CONTRACT_VERSION + 1}"),
    "a model file that is not there": (lambda tmp_path: hand_written_state(str(tmp_path / "no-such-model.onnx")), "no-such-model.onnx"),
}


@pytest.mark.parametrize("case", sorted(UNSERVABLE))
def test_a_worker_given_a_state_file_it_cannot_apply_exits_2_with_one_line_naming_the_file_and_why(tmp_path, case):
    document, reason = UNSERVABLE[case]
    state_file = tmp_path / "state.json"
    state_file.write_bytes(orjson.dumps(document(tmp_path)))
    environment = {"PATH": "/usr/bin:/bin", "SERVING_DEVICE": "cpu", "SERVING_CACHE_DIR": str(tmp_path / "cache"),
                   "CONSOLE_URL": f"http://127.0.0.1:{free_port()}"}  # nothing there: a path it sends to a console fails fast

    finished = subprocess.run([sys.executable, "-m", "serving.worker", "--port", str(free_port()), "--state-file", str(state_file)],
                              cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=60, check=False)

    assert finished.returncode == 2, finished.stderr
    assert "Traceback" not in finished.stderr
    lines = [json.loads(line) for line in finished.stderr.splitlines()]  # every line keeps the JSON log shape
    naming_the_file = [line for line in lines if str(state_file) in json.dumps(line)]
    assert naming_the_file == [lines[-1]], finished.stderr
    assert lines[-1]["event"] == "bad_state_file" and reason in lines[-1]["reason"], finished.stderr
