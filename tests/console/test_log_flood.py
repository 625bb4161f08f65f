"""The console as deployed (uvicorn), flooded with requests whose every one is logged as a
warning or an error: malformed HTTP, a Host header not in ALLOWED_HOSTS. Each place in the
code writes only a few lines a window, so no client decides how fast the log grows."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from serving.log_throttle import BURST, MAX_MESSAGE_CHARS, WINDOW_S

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def console(tmp_path):
    port = free_port()
    environment = {**os.environ, "DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO_ROOT)}
    log = tmp_path / "console.log"
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
                                "--port", str(port), "--no-access-log"], cwd=REPO_ROOT, env=environment,
                               stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    process.log = log
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield port, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


def output_of(process: subprocess.Popen) -> str:
    process.terminate()
    process.wait(timeout=15)
    return process.log.read_text()


def allowed_lines(started: float) -> int:
    """A burst a window: on a loaded box the requests can outlast one window (18 lines were
    written in a run that took more than 10 s), never a line a request."""
    return BURST * (int((time.monotonic() - started) // WINDOW_S) + 1)


def send_raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        return connection.recv(4096)


def test_malformed_requests_write_only_a_few_lines(console):
    port, process = console

    started = time.monotonic()
    answers = [send_raw(port, b"NOT HTTP AT ALL\r\n\r\n") for _ in range(200)]

    assert all(answer.startswith(b"HTTP/1.1 400 ") for answer in answers)
    assert 1 <= output_of(process).count("Invalid HTTP request received") <= allowed_lines(started)


def test_requests_for_a_foreign_host_write_only_a_few_short_lines(console):
    port, process = console
    long_host = "a" * 8000 + ".example"

    started = time.monotonic()
    answers = [httpx.get(f"http://127.0.0.1:{port}/login/", headers={"Host": host}, timeout=10)
               for host in [long_host] * 20 + ["attacker.example"] * 100]

    assert {answer.status_code for answer in answers} == {400}
    lines = output_of(process).splitlines()
    assert 1 <= sum(line.startswith("Invalid HTTP_HOST header") for line in lines) <= allowed_lines(started)
    assert not [line for line in lines if line.startswith("Traceback")]  # Django's own frames, the same each time
    assert max(len(line) for line in lines) < MAX_MESSAGE_CHARS + 100


def test_long_paths_write_no_access_lines_under_no_access_log(console):
    port, process = console
    long_path = "/" + "x" * 8000

    answers = [httpx.get(f"http://127.0.0.1:{port}{long_path}", timeout=10) for _ in range(20)]

    assert {answer.status_code for answer in answers} == {404}
    assert "x" * 100 not in output_of(process)
