"""A stop asked while a worker loads its state file (SIGTERM from an orchestrator, Ctrl-C in
a terminal) is a graceful stop once the load ends, as it was when the load ran in
uvicorn's lifespan: it killed the worker on the spot (SIGTERM, no log line) or printed a
KeyboardInterrupt traceback (SIGINT)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import orjson
import pytest
from serving_testkit import REPO_ROOT, free_port, relu_any_width, route, state, write_model

ANSWER_AFTER_S = 2.0  # the artifact's server holds the download this long: the load is under way meanwhile


class SlowArtifactServer:
    """Answers every GET with ``payload`` after ANSWER_AFTER_S; ``asked`` is set once a
    request has arrived (the worker's load is under way)."""

    def __init__(self, payload: bytes):
        self.payload, self.asked = payload, threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        with connection:
            connection.recv(65536)
            self.asked.set()
            time.sleep(ANSWER_AFTER_S)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(self.payload)}\r\nConnection: close\r\n\r\n".encode()
            connection.sendall(head + self.payload)

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_asked_while_the_state_file_loads_drains_once_loaded_and_exits_0(tmp_path, stop):
    path, sha256 = write_model(tmp_path, "relu", relu_any_width())
    server = SlowArtifactServer(path.read_bytes())
    served = {"digits": {"routes": [{**route(1, 100, path, sha256), "artifact_url": "/artifacts/relu.onnx"}]}}
    state_file = tmp_path / "state.json"
    state_file.write_bytes(orjson.dumps(state(1, served)))
    environment = {"PATH": "/usr/bin:/bin", "SERVING_DEVICE": "cpu", "SERVING_CACHE_DIR": str(tmp_path / "cache"),
                   "CONSOLE_URL": server.url, "SERVING_DRAIN_DELAY_S": "0"}
    worker = subprocess.Popen([sys.executable, "-m", "serving.worker", "--port", str(free_port()), "--state-file", str(state_file)],
                              cwd=REPO_ROOT, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert server.asked.wait(30), "the worker never asked for its artifact"
        worker.send_signal(stop)
        _, logged = worker.communicate(timeout=60)
    finally:
        worker.kill()
        server.close()

    assert worker.returncode == 0, logged
    assert "Traceback" not in logged
    events = [event for line in logged.splitlines() if (event := json.loads(line).get("event"))]
    assert events[-4:] == ["drain_started", "stopped_accepting", "drained", "worker_exit"], logged
