"""The no-ASGI reference servers of bench/http_ceiling.py: their figures are only a floor
under the worker's if they answer what wrk sends, as HTTP/1.1 does, on kept-alive
connections, and hang up on what is not HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from bench.http_ceiling import ROOT
from bench.serve_bench import free_port

REQUEST = (b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
           b'{"x":[1,2]}')


@pytest.fixture(params=["protocol", "prototask"])
def bare_server(request):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "bench.http_ceiling", "--serve", request.param, "--port", str(port)],
                               cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "the reference server did not start"
                time.sleep(0.05)
        yield port
    finally:
        process.kill()
        process.wait(timeout=10)


def read_answer(connection: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"}"):
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_a_bare_server_answers_each_request_on_one_kept_alive_connection(bare_server):
    with socket.create_connection(("127.0.0.1", bare_server), timeout=5) as connection:
        for _ in range(3):
            connection.sendall(REQUEST)
            answer = read_answer(connection)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            assert answer.endswith(b'\r\n\r\n{"ok":true}')


def test_a_bare_server_hangs_up_on_what_is_not_http(bare_server):
    with socket.create_connection(("127.0.0.1", bare_server), timeout=5) as connection:
        connection.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        assert connection.recv(4096) == b""
