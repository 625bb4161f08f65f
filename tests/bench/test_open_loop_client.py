"""The C open-loop generator (bench/open_loop_client.c) that the overload benchmark's
open-loop row relies on: it must send the schedule, count every request once, and
behave as an HTTP client does with keep-alive and `Connection: close`."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter

import pytest

from bench import native_client

REQUEST = b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"


class Server:
    """A loopback HTTP server, one thread per connection: answers each request 200 after
    reading it, closing the connection 0.2 s after every `close_every`-th answer (sent with
    `Connection: close`), or, with `answer=False`, never answers and closes after 0.3 s."""

    def __init__(self, close_every: int = 0, answer: bool = True):
        self.close_every, self.answer = close_every, answer
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        answered, pending = 0, b""
        with connection:
            connection.settimeout(0.3 if not self.answer else 5.0)
            while True:
                try:
                    data = connection.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                pending += data
                while self.answer and len(pending) >= len(REQUEST):
                    pending = pending[len(REQUEST):]
                    answered += 1
                    closing = self.close_every and answered % self.close_every == 0
                    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n" + (b"connection: close\r\n" if closing else b"")
                    connection.sendall(head + b"\r\nok")
                    if closing:  # held open a while, as a server finishing its write would: a client must not reuse it
                        time.sleep(0.2)
                        return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def server(request):
    server = Server(**getattr(request, "param", {}))
    yield server
    server.close()


def test_every_scheduled_request_is_sent_and_answered_once(server):
    result, summary = native_client.open_loop(server.port, REQUEST, rate_per_s=1000, duration_s=0.5, connections=4)
    assert {status: len(values) for status, values in result.latencies_s.items()} == {200: 500}
    assert "scheduled 500 recorded 500 drops 0 unanswered 0" in summary
    assert len(result.send_lags_s) == 500
    # Kept alive and reused, not one per request. A request that finds every connection busy
    # opens another (open loop): on a loaded 2-core box the thread-per-connection server is
    # slow enough that 22 were open once, so the bound is far from 500, not near the 4 asked for.
    assert server.connections <= 50


@pytest.mark.parametrize("server", [{"close_every": 3}], indirect=True)
def test_a_connection_answered_connection_close_is_not_reused(server):
    result, _ = native_client.open_loop(server.port, REQUEST, rate_per_s=600, duration_s=0.5, connections=2)
    assert {status: len(values) for status, values in result.latencies_s.items()} == {200: 300}
    assert server.connections >= 300 // 3  # a new connection after every third answer


@pytest.mark.parametrize("server", [{"answer": False}], indirect=True)
def test_past_its_connections_a_request_is_a_client_side_drop_and_a_broken_one_a_failure(server):
    result, summary = native_client.open_loop(server.port, REQUEST, rate_per_s=100, duration_s=0.2, connections=2,
                                              max_connections=3)
    statuses = Counter({status: len(values) for status, values in result.latencies_s.items()})
    assert statuses == {0: 15, -1: 5}  # 5 connections each hold one request the server closes unanswered
    assert "slots 5" in summary
    assert len(result.send_lags_s) == 5  # drops were never written
