"""The worker's HTTP protocol: each response leaves in one write, and slow or oversized
clients are cut off by deadlines and caps."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import orjson
import pytest
import uvicorn
from serving_testkit import HeldRun, free_port, route, state, v2_body, wait_until

from serving import http_protocol
from serving.http_protocol import CoalescingTransport, listen_backlog


class RecordingTransport:
    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 7


class ManualLoop:
    def __init__(self):
        self.callbacks = []

    def call_soon(self, callback, *args):
        self.callbacks.append((callback, args))

    def run_once(self):
        callbacks, self.callbacks = self.callbacks, []
        for callback, args in callbacks:
            callback(*args)


def test_writes_in_one_loop_iteration_leave_as_one():
    transport, loop = RecordingTransport(), ManualLoop()
    coalescing = CoalescingTransport(transport, loop)

    coalescing.write(b"HTTP/1.1 200 OK\r\n\r\n")
    coalescing.write(b"body")
    assert transport.writes == []
    loop.run_once()

    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]


def test_close_sends_what_is_held_first():
    transport, loop = RecordingTransport(), ManualLoop()
    coalescing = CoalescingTransport(transport, loop)

    coalescing.write(b"last words")
    coalescing.close()

    assert (transport.writes, transport.closed) == ([b"last words"], True)


def test_other_transport_calls_go_straight_through():
    coalescing = CoalescingTransport(RecordingTransport(), ManualLoop())

    assert coalescing.get_write_buffer_size() == 7


def test_keep_alive_connection_gets_whole_responses(digits_worker):
    host, port = digits_worker.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        for _ in range(3):
            connection.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b'{"live":true}'):
                chunk = connection.recv(4096)  # each wait bounded by the socket's timeout
                assert chunk, f"the server closed the connection mid-response after {answer[:200]!r}"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 OK")



def test_a_head_request_gets_the_head_without_a_body_and_the_connection_stays_in_step(digits_worker):
    """A body after a HEAD's head would be read as the start of the next answer."""
    host, port = digits_worker.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n" + LIVE)
        answer = b""
        while not answer.endswith(b'{"live":true}'):
            chunk = connection.recv(4096)
            assert chunk, f"closed after {answer[:300]!r}"
            answer += chunk

    first, second = answer.split(b"\r\n\r\n", 1)  # the HEAD's head, then the GET's whole answer
    assert first.startswith(b"HTTP/1.1 200 ")
    assert b"content-length: 13" in first.lower()  # naming the body it leaves out
    assert second.startswith(b"HTTP/1.1 200 OK") and second.endswith(b'{"live":true}')


def test_an_inference_answer_carries_its_headers_and_leaves_in_one_write(digits_worker):
    """The date, the content type and length, the request id (the client's when sane),
    the model version that answered; head and body in one read."""
    host, port = digits_worker.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(head(extra="X-Request-Id: mine-1\r\n") + BODY)
        answer = connection.recv(65536)  # one write: head and body arrive together

    head_part, body = answer.split(b"\r\n\r\n", 1)
    lines = head_part.lower().split(b"\r\n")
    assert lines[0] == b"http/1.1 200 ok"
    assert any(line.startswith(b"date: ") for line in lines)
    assert b"content-type: application/json" in lines
    assert f"content-length: {len(body)}".encode() in lines
    assert b"x-request-id: mine-1" in lines
    assert b"x-model-version: 1" in lines
    assert orjson.loads(body)["model_name"] == "digits"


# ---- pipelining: a client may send before it reads, but not without bound -------------

LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


def answers_in(data: bytes) -> int:
    return data.count(b"HTTP/1.1 200 OK")


def test_pipelined_requests_are_each_answered_in_order_on_one_connection(digits_worker):
    host, port = digits_worker.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(LIVE * 10 + head() + BODY)
        answer = b""
        while answers_in(answer) < 11 or not answer.endswith(b"}"):
            chunk = connection.recv(65536)
            assert chunk, f"closed after {answers_in(answer)} answers"
            answer += chunk

    assert answer.count(b'{"live":true}') == 10
    assert b'"model_name":"digits"' in answer.rsplit(b"HTTP/1.1 200 OK", 1)[1]  # the inference, answered last


def test_a_connection_that_pipelines_past_the_cap_is_closed_and_the_worker_serves_others(digits_worker, client):
    from serving.http_protocol import MAX_PIPELINED

    host, port = digits_worker.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(LIVE * 500)
        answered = answers_in(read_until_closed(connection))

    assert answered <= MAX_PIPELINED + 1
    assert client.get(digits_worker.url + "/v2/health/live").status_code == 200


def test_a_client_that_pipelines_and_never_reads_cannot_make_the_worker_read_on(digits_worker, client):
    """Inference requests sent for 3 s, none of the answers read: the worker stops reading
    while requests wait and hangs up past MAX_PIPELINED, so the client gets no further
    than the kernel's buffers. Before, each answer let another chunk in: 67 MB in 3 s
    here, and 2.4 GB of worker memory in 14 s on four connections in an audit."""
    host, port = digits_worker.url.removeprefix("http://").split(":")
    batch, sent = (head() + BODY) * 8, 0
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.setblocking(False)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                sent += connection.send(memoryview(batch)[sent % len(batch):])  # whole requests, in order
            except BlockingIOError:
                time.sleep(0.01)
            except OSError:  # the worker hung up: also bounded
                break

    assert sent < 32 * 2**20, f"the worker took {sent / 2**20:.0f} MB of requests it never answered"
    assert client.get(digits_worker.url + "/v2/health/live").status_code == 200


# ---- guards against slow and oversized clients (raw sockets, every read bounded) -------

INFER = "/v2/models/digits/infer"
BODY = orjson.dumps(v2_body(np.zeros((1, 64), np.float32)))


def read_until_closed(connection: socket.socket, timeout_s: float = 5.0) -> bytes:
    """Everything the server sends until it closes; fails (never hangs) past timeout_s."""
    deadline, answer = time.monotonic() + timeout_s, b""
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"server neither answered nor closed within {timeout_s} s: {answer[:200]!r}"
        connection.settimeout(remaining)
        try:
            chunk = connection.recv(65536)
        except ConnectionResetError:
            return answer
        if not chunk:
            return answer
        answer += chunk



@pytest.fixture
def guarded_worker(start_worker, mlp_v1, relu_model):
    """start(**limits) -> a digits worker whose engine records every run in worker.runs; it
    also serves relu, whose dynamic width leaves its bodies SERVING_MAX_BODY_BYTES."""

    def start(**overrides):
        models = {"digits": {"routes": [route(1, 100, *mlp_v1)]}, "relu": {"routes": [route(1, 100, *relu_model)]}}
        worker = start_worker(state(1, models), **overrides)
        version = worker.worker.repository.loaded[("digits", 1)]
        worker.runs, original = [], version.engine.run
        version.engine.run = lambda feeds: worker.runs.append(1) or original(feeds)
        return worker

    return start


# Large bodies go to relu, held to SERVING_MAX_BODY_BYTES alone (a dynamic width): digits
# takes at most what its version's inputs can fill (v2_body_limit).
LARGE_BODY_PATH = "/v2/models/relu/infer"


def head(path: str = INFER, length: int = len(BODY), extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n{extra}\r\n".encode()


def test_a_body_that_never_finishes_gets_408_and_frees_its_in_flight_slot(guarded_worker, client):
    worker = guarded_worker(body_timeout_s=0.3, max_in_flight=1)

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        started = time.monotonic()
        connection.sendall(head() + BODY[:20])  # the rest never comes
        answer = read_until_closed(connection)

    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"request body did not arrive within 0.3 s" in answer
    assert 0.25 < time.monotonic() - started < 3
    assert wait_until(lambda: worker.worker.app.in_flight == 0)
    assert worker.runs == []
    assert client.post(worker.url + INFER, content=BODY).status_code == 200  # the only slot is free again


@contextlib.contextmanager
def most_of_a_body_held(worker):
    """A client that sent 900,000 bytes of a 1,000,000-byte body and waits: they are held."""
    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as holding:
        holding.sendall(head(LARGE_BODY_PATH, length=1_000_000) + b"[" * 900_000)
        assert wait_until(lambda: worker.worker.app.body_buffer.held == 900_000)
        yield


def test_bodies_being_received_together_are_held_under_the_buffer(guarded_worker, client):
    worker = guarded_worker(max_body_buffer_bytes=1_500_000)
    app = worker.worker.app

    with most_of_a_body_held(worker):
        with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as second:
            second.sendall(head(LARGE_BODY_PATH, length=1_000_000) + b"[" * 700_000)  # past the 600,000 left
            answer = second.recv(65536)

    assert answer.startswith(b"HTTP/1.1 503 ")
    assert b"retry-after: 1" in answer.lower()
    assert b"SERVING_MAX_BODY_BUFFER_BYTES" in answer
    assert wait_until(lambda: app.body_buffer.held == 0)  # the holder went away: its share is back
    assert client.post(worker.url + INFER, content=BODY).status_code == 200
    assert app.body_buffer.held == 0


def test_a_declared_body_the_full_buffer_has_no_room_for_is_refused_before_100_continue(guarded_worker):
    worker = guarded_worker(max_body_buffer_bytes=1_500_000)

    with most_of_a_body_held(worker):
        with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as waiting:
            waiting.sendall(head(LARGE_BODY_PATH, length=1_000_000, extra="Expect: 100-continue\r\n"))  # sends its body only if told to
            answer = waiting.recv(65536)

    assert answer.startswith(b"HTTP/1.1 503 ") and b"100 Continue" not in answer
    assert b"SERVING_MAX_BODY_BUFFER_BYTES" in answer


def test_headers_alone_hold_nothing_of_the_buffer(guarded_worker, client):
    # A declared length was taken before a byte of it came: 2,800 connections declaring
    # 190 KB each, about 300 KB sent in all, had every other request refused.
    worker = guarded_worker(max_body_buffer_bytes=1_500_000)
    declaring = [socket.create_connection(("127.0.0.1", worker.port), timeout=5) for _ in range(4)]
    try:
        for connection in declaring:
            connection.sendall(head(LARGE_BODY_PATH, length=1_000_000))  # and nothing of it
        time.sleep(0.3)

        assert worker.worker.app.body_buffer.held == 0
        assert [client.post(worker.url + INFER, content=BODY).status_code for _ in range(3)] == [200] * 3
    finally:
        for connection in declaring:
            connection.close()


def first_bytes(connection: socket.socket) -> bytes:
    """What the server has sent so far (b"" when it is still waiting for the body)."""
    connection.settimeout(0.5)
    try:
        return connection.recv(65536)
    except TimeoutError:
        return b""


def test_clients_holding_large_bodies_leave_half_the_buffer_to_small_requests(guarded_worker, client):
    worker = guarded_worker(max_body_buffer_bytes=6_000_000, max_body_bytes=4_000_000)
    app = worker.worker.app
    holders = [socket.create_connection(("127.0.0.1", worker.port), timeout=5) for _ in range(3)]
    try:
        for holder in holders:
            holder.sendall(head(LARGE_BODY_PATH, length=2_000_000) + b"[" * 1_600_000)
        assert wait_until(lambda: app.body_buffer.held == 1_600_000)  # a second large body would pass half
        answers = [first_bytes(holder) for holder in holders]

        assert sorted(answer[:13] for answer in answers) == [b"", b"HTTP/1.1 503 ", b"HTTP/1.1 503 "]
        assert client.post(worker.url + INFER, content=BODY).status_code == 200  # the other half serves
        assert [client.post(worker.url + INFER, content=BODY).status_code for _ in range(5)] == [200] * 5
    finally:
        for holder in holders:
            holder.close()
    assert wait_until(lambda: app.body_buffer.held == 0)


def test_headers_that_never_finish_get_408(guarded_worker):
    worker = guarded_worker(header_timeout_s=0.3)

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Le")
        answer = read_until_closed(connection)

    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"request headers did not arrive" in answer


def test_a_connection_that_sends_nothing_is_closed_after_the_header_deadline(guarded_worker):
    worker = guarded_worker(header_timeout_s=0.3)

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        started = time.monotonic()
        answer = read_until_closed(connection)

    assert answer == b""
    assert time.monotonic() - started < 3


def test_a_slowly_dripped_request_is_cut_at_the_header_deadline(guarded_worker):
    worker = guarded_worker(header_timeout_s=0.5)
    request = head() + BODY

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        started, closed = time.monotonic(), False
        for byte in request[:40]:
            try:
                connection.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.05)
        answer = b"" if closed else read_until_closed(connection)

    assert closed or answer.startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < 4
    assert worker.runs == []


@pytest.mark.parametrize("layout", ["one header", "many headers", "long url", "in pieces"])
def test_headers_past_the_cap_get_431(guarded_worker, layout):
    worker = guarded_worker(max_header_bytes=4096)
    if layout == "one header":
        requests = [head(extra="X-Padding: " + "p" * 5000 + "\r\n") + BODY]
    elif layout == "many headers":
        requests = [head(extra="".join(f"X-H{i}: {'v' * 40}\r\n" for i in range(200))) + BODY]
    elif layout == "long url":
        requests = [head(path=INFER + "?" + "q" * 5000) + BODY]
    else:
        big = head(extra="X-Padding: " + "p" * 20000 + "\r\n")  # sent only until past the cap: the server
        requests = [big[i:i + 1000] for i in range(0, 5000, 1000)]  # reads all of it, so it closes with FIN, not RST

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        try:
            for piece in requests:
                connection.sendall(piece)
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = read_until_closed(connection)

    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b"request headers exceed 4096 bytes" in answer
    assert worker.runs == []


def test_headers_under_the_cap_are_served(guarded_worker):
    worker = guarded_worker(max_header_bytes=4096)

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(head(extra="X-Padding: " + "p" * 3000 + "\r\nConnection: close\r\n") + BODY)
        answer = read_until_closed(connection)

    assert answer.startswith(b"HTTP/1.1 200 ")


def refused_by_worker(worker) -> float:
    for line in httpx.get(worker.url + "/metrics", headers={"Connection": "close"}).text.splitlines():
        if line.startswith('modelops_connections_refused_total{by="worker"}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("/metrics has no modelops_connections_refused_total{by=\"worker\"}")


class AtTheCap:
    """A digits worker capped at two connections, and the clients a test opens on it."""

    def __init__(self, worker):
        self.worker = worker
        self.connections = worker.server.server_state.connections
        self.held: list[socket.socket] = []
        self._opened: list[socket.socket] = []

    def fill(self) -> AtTheCap:
        """Both slots held by idle clients (under the 5 s header deadline): the next one is past the cap."""
        self.held = [self.one_more() for _ in range(2)]
        assert wait_until(lambda: len(self.connections) == 2)
        return self

    def one_more(self) -> socket.socket:
        connection = socket.create_connection(("127.0.0.1", self.worker.port), timeout=5)
        self._opened.append(connection)
        return connection

    def release(self) -> None:
        """The held clients go away: their slots are free again."""
        for connection in self.held:
            connection.close()

    def close_all(self) -> None:
        for connection in self._opened:
            connection.close()


@pytest.fixture
def at_the_cap(guarded_worker):
    """at_the_cap(fill=True) -> AtTheCap, its two slots held (fill=False: not yet, for what
    needs a connection of its own first); every client opened through it closes at teardown."""
    started: list[AtTheCap] = []

    def start(fill: bool = True) -> AtTheCap:
        cap = AtTheCap(guarded_worker(max_connections=2, header_timeout_s=5.0))
        started.append(cap)
        return cap.fill() if fill else cap

    yield start
    for cap in started:
        cap.close_all()


def test_connections_past_the_cap_get_503_and_are_closed(at_the_cap, client):
    cap = at_the_cap()
    with cap.one_more() as extra:
        extra.sendall(head() + BODY)
        answer = read_until_closed(extra)
    cap.release()

    assert answer.startswith(b"HTTP/1.1 503 ")
    assert b"retry-after: 1" in answer
    assert wait_until(lambda: len(cap.connections) == 0)
    assert cap.worker.runs == []  # its request, whole before the refusal, was never read
    assert client.post(cap.worker.url + INFER, content=BODY).status_code == 200


BIG_BODY = b"[" * (4 * 2**20)  # larger than the kernel's buffers: the client is still sending when refused


def test_a_client_mid_upload_past_the_connection_cap_reads_its_503(at_the_cap):
    """The refusal is written before the body is read: closing at once, with the body
    unread, was a reset, and the client's send failed before it could read the 503."""
    cap = at_the_cap()
    with cap.one_more() as extra:
        extra.sendall(head(length=len(BIG_BODY)) + BIG_BODY)  # raises on a reset
        answer = read_until_closed(extra)
    cap.release()

    assert answer.startswith(b"HTTP/1.1 503 ")
    assert b"retry-after: 1" in answer
    assert wait_until(lambda: len(cap.connections) == 0)
    assert cap.worker.runs == []


def test_a_refused_client_that_never_stops_sending_is_cut_at_the_linger_bound(at_the_cap, monkeypatch):
    """A lingering refusal reads what still comes, but for LINGER_MAX_S at most."""
    monkeypatch.setattr(http_protocol, "LINGER_QUIET_S", 0.3)
    monkeypatch.setattr(http_protocol, "LINGER_MAX_S", 0.5)
    cap = at_the_cap()
    with cap.one_more() as extra:
        extra.sendall(head(length=10**9))
        assert wait_until(lambda: len(cap.connections) == 3)
        started = time.monotonic()  # the refusal lingers from about here
        while len(cap.connections) > 2 and time.monotonic() - started < 5:
            try:
                extra.sendall(b"[" * 1000)  # never quiet for LINGER_QUIET_S
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)
        took_s = time.monotonic() - started
    cap.release()

    assert 0.4 < took_s < 2
    assert wait_until(lambda: len(cap.connections) == 0)
    assert cap.worker.runs == []


def test_past_the_lingering_bound_a_refusal_closes_at_once(at_the_cap, monkeypatch):
    """A refusal that lingers holds an open file until its client closes: clients that never
    close must not take the files the cap leaves for the rest of the worker."""
    monkeypatch.setattr(http_protocol, "MAX_LINGERING_REFUSALS", 1)
    monkeypatch.setattr(http_protocol, "LINGER_QUIET_S", 30.0)
    cap = at_the_cap()
    refused = [cap.one_more(), cap.one_more()]
    # Each refused client reads its 503 and end of file (written whether it lingers or not), and stays.
    assert read_until_closed(refused[0]).startswith(b"HTTP/1.1 503 ")
    assert read_until_closed(refused[1]).startswith(b"HTTP/1.1 503 ")
    assert wait_until(lambda: len(cap.connections) == 3)  # the first lingers, the second was closed at once
    time.sleep(0.1)
    assert len(cap.connections) == 3
    cap.close_all()

    assert wait_until(lambda: len(cap.connections) == 0)  # a lingering refusal ends when its client closes


def test_a_refusal_still_lingering_holds_no_slot_of_the_cap(at_the_cap, client, monkeypatch):
    """Refused clients that have not closed yet must not keep a worker that has room full."""
    monkeypatch.setattr(http_protocol, "LINGER_QUIET_S", 30.0)
    cap = at_the_cap()
    refused = cap.one_more()
    assert read_until_closed(refused).startswith(b"HTTP/1.1 503 ")  # and it stays open, lingering
    cap.held.pop().close()
    assert wait_until(lambda: len(cap.connections) == 2)  # one held, one lingering: one slot free

    assert client.post(cap.worker.url + INFER, content=BODY).status_code == 200


def test_a_refusal_past_the_connection_cap_is_counted_in_metrics(at_the_cap):
    cap = at_the_cap(fill=False)
    before = refused_by_worker(cap.worker)  # the counter is the process's: other tests' workers add to it
    assert wait_until(lambda: len(cap.connections) == 0)
    cap.fill()
    with cap.one_more() as extra:
        extra.sendall(head() + BODY)
        read_until_closed(extra)
    cap.release()

    assert refused_by_worker(cap.worker) == before + 1


# ---- refusals for what was sent (400, 408, 431): a lingering close, not a reset -------

TLS_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64)  # a TLS client on the plain port: a 400
HEADER_ARRIVING = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nX-Padding: ".encode()  # a header still coming
CHUNKED = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()

# Each refused while its client is still sending: the worker's limits, what the client sends
# first, what it goes on sending (about every 20 ms), and the answer's status line.
STILL_SENDING = [
    pytest.param({}, CHUNKED + b"zz\r\n", b"[" * 1000, b"HTTP/1.1 400 ", id="400 a malformed chunk mid-upload"),
    pytest.param({"header_timeout_s": 0.3}, HEADER_ARRIVING, b"p" * 20, b"HTTP/1.1 408 ", id="408 headers dripping"),
    pytest.param({"body_timeout_s": 0.3}, head(LARGE_BODY_PATH, length=500_000), b"[" * 100, b"HTTP/1.1 408 ", id="408 a slow upload"),
    pytest.param({"max_header_bytes": 4096}, HEADER_ARRIVING, b"p" * 1000, b"HTTP/1.1 431 ", id="431 a header streaming"),
    pytest.param({"max_header_bytes": 4096}, CHUNKED + b"1;ext=", b"e" * 1000, b"HTTP/1.1 413 ", id="413 a chunk extension streaming"),
]


def chunked_close(path: str = INFER) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()


def in_chunks(body: bytes, size: int, extension: bytes = b"") -> bytes:
    return b"".join(b"%x%s\r\n%s\r\n" % (len(body[i:i + size]), extension, body[i:i + size]) for i in range(0, len(body), size)) + b"0\r\n\r\n"


def send_in_reads(connection: socket.socket, data: bytes, piece: int = 2000) -> None:
    for start in range(0, len(data), piece):
        connection.sendall(data[start:start + piece])
        time.sleep(0.002)  # each its own read: the worker counts framing over the reads after the headers


def test_chunk_extensions_streamed_past_the_header_cap_are_a_413_naming_the_framing(guarded_worker, client):
    """llhttp reads a chunk extension of any length and reports none of it: a client streamed
    42 GB of one in 35 s, cut only by the body deadline."""
    worker = guarded_worker(max_header_bytes=4096)

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(chunked_close() + b"1;ext=")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            send_in_reads(connection, b"e" * 8000, piece=500)
        answer = read_until_closed(connection)

    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"framing (chunk size lines and extensions) exceeds its data by more than 4096 bytes" in answer
    assert worker.runs == []
    assert client.post(worker.url + INFER, content=BODY).status_code == 200


def test_a_large_body_in_small_chunks_is_served_though_its_framing_outgrows_the_header_cap(guarded_worker):
    worker = guarded_worker(max_header_bytes=4096)
    body = orjson.dumps(v2_body(np.ones((1, 20_000), np.float32)))
    chunks = in_chunks(body, 16, b";n=1")  # 13 bytes of framing for 16 of data: far past 4096 in all

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        send_in_reads(connection, chunked_close(LARGE_BODY_PATH) + chunks)
        answer = read_until_closed(connection)

    assert len(chunks) - len(body) > 10 * 4096
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]


def refusals_lingering(worker) -> int:
    return worker.server.config.http_protocol_class.refusals_lingering[0]


def read_for(connection: socket.socket, seconds: float) -> bytes:
    """What arrives within ``seconds`` (b"" after as long at end of file). A reset fails the test."""
    connection.settimeout(seconds)
    try:
        chunk = connection.recv(65536)
    except TimeoutError:
        return b""
    except ConnectionResetError as error:
        pytest.fail(f"reset while reading the answer: {error!r}")
    if not chunk:
        time.sleep(seconds)
    return chunk


def send_past_the_answer(connection: socket.socket, piece: bytes, after_s: float, timeout_s: float = 5.0) -> tuple[bytes, float]:
    """A client that does not look for an answer while it sends: ``piece`` about every 20 ms,
    what arrives meanwhile kept, for ``after_s`` past a whole answer. (What it read, when the
    answer was whole.) A send that fails fails the test: a client's send failing is how it
    loses an answer it has not read. Fails, never hangs, past timeout_s."""
    answer, answered_at, deadline = b"", None, time.monotonic() + timeout_s
    while answered_at is None or time.monotonic() < answered_at + after_s:
        assert time.monotonic() < deadline, f"no whole answer within {timeout_s} s: {answer[:200]!r}"
        connection.settimeout(5)
        try:
            connection.sendall(piece)
        except (BrokenPipeError, ConnectionResetError) as error:
            pytest.fail(f"the send failed ({error!r}) after {answer[:200]!r}")
        answer += read_for(connection, 0.02)
        if answered_at is None and whole_answer_in(answer):
            answered_at = time.monotonic()
    return answer, answered_at


@pytest.mark.parametrize(("limits", "opening", "piece", "status_line"), STILL_SENDING)
def test_a_client_still_sending_reads_its_refusal_and_the_connection_ends_once_it_is_quiet(
        guarded_worker, limits, opening, piece, status_line):
    """Closing at once left the client's bytes unread: a reset, and its next send failed
    before it read the answer. The connection reads and drops what still comes, and ends
    LINGER_QUIET_S after the client goes quiet."""
    worker = guarded_worker(**limits)
    connections = worker.server.server_state.connections

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(opening)
        answer, answered_at = send_past_the_answer(connection, piece, after_s=0.3)
        quiet_at = time.monotonic()
        answer += read_until_closed(connection)  # end of file follows the answer
        assert wait_until(lambda: len(connections) == 0, timeout_s=http_protocol.LINGER_QUIET_S + 4)
        ended_at = time.monotonic()

    [(head_part, _)] = split_answers(answer)
    assert head_part.startswith(status_line.lower())
    assert b"connection: close" in head_part.split(b"\r\n")
    assert ended_at - quiet_at < http_protocol.LINGER_QUIET_S + 2
    assert ended_at - answered_at < http_protocol.LINGER_MAX_S + 2
    assert refusals_lingering(worker) == 0
    assert worker.runs == []


@pytest.mark.parametrize(("limits", "opening", "piece", "status_line"), STILL_SENDING)
def test_a_client_that_never_goes_quiet_after_its_refusal_is_cut_at_the_linger_bound(
        guarded_worker, monkeypatch, limits, opening, piece, status_line):
    monkeypatch.setattr(http_protocol, "LINGER_QUIET_S", 0.3)
    monkeypatch.setattr(http_protocol, "LINGER_MAX_S", 1.0)
    worker = guarded_worker(**limits)
    connections = worker.server.server_state.connections

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(opening)
        answer, answered_at = send_past_the_answer(connection, piece, after_s=0.2)
        deadline = time.monotonic() + 5
        while connections and time.monotonic() < deadline:
            try:
                connection.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break  # cut: the client was still sending
            time.sleep(0.02)
        took_s = time.monotonic() - answered_at

    assert answer.startswith(status_line)
    assert 0.5 < took_s < 3
    assert wait_until(lambda: len(connections) == 0)
    assert refusals_lingering(worker) == 0


def test_past_the_lingering_bound_a_refusal_for_what_was_sent_closes_at_once(guarded_worker, monkeypatch):
    """The 400, 408 and 431 that linger count in the cap refusals' MAX_LINGERING_REFUSALS."""
    monkeypatch.setattr(http_protocol, "MAX_LINGERING_REFUSALS", 2)
    monkeypatch.setattr(http_protocol, "LINGER_QUIET_S", 30.0)
    worker = guarded_worker(header_timeout_s=0.3, max_header_bytes=4096)
    connections = worker.server.server_state.connections
    clients = [socket.create_connection(("127.0.0.1", worker.port), timeout=5) for _ in range(2)]
    try:
        clients[0].sendall(TLS_HELLO)
        assert read_until_closed(clients[0]).startswith(b"HTTP/1.1 400 ")
        clients[1].sendall(HEADER_ARRIVING + b"p" * 5000)
        assert read_until_closed(clients[1]).startswith(b"HTTP/1.1 431 ")
        assert wait_until(lambda: refusals_lingering(worker) == 2)
        # Connected only now: idle past the 0.3 s deadline, it would be closed with nothing to answer.
        clients.append(socket.create_connection(("127.0.0.1", worker.port), timeout=5))
        clients[2].sendall(HEADER_ARRIVING)  # its 408 comes at the header deadline
        assert read_until_closed(clients[2]).startswith(b"HTTP/1.1 408 ")
        assert wait_until(lambda: len(connections) == 2)  # the 408 closed at once, the others linger
        time.sleep(0.1)
        assert len(connections) == 2 and refusals_lingering(worker) == 2
    finally:
        for connection in clients:
            connection.close()

    assert wait_until(lambda: len(connections) == 0)  # a lingering refusal ends when its client closes
    assert refusals_lingering(worker) == 0


def test_a_refusal_for_what_was_sent_lingers_without_holding_a_slot_of_the_cap(at_the_cap, client, monkeypatch):
    """Else a client sending garbage on each of its connections keeps clients that would be
    served from the worker's slots, for as long as its refusals linger."""
    monkeypatch.setattr(http_protocol, "LINGER_QUIET_S", 30.0)
    cap = at_the_cap()
    cap.held.pop().close()
    assert wait_until(lambda: len(cap.connections) == 1)
    refused = cap.one_more()
    refused.sendall(TLS_HELLO)
    assert read_until_closed(refused).startswith(b"HTTP/1.1 400 ")
    assert wait_until(lambda: refusals_lingering(cap.worker) == 1)
    assert len(cap.connections) == 2  # one held, one lingering: one slot free

    assert client.post(cap.worker.url + INFER, content=BODY).status_code == 200


def test_a_graceful_stop_does_not_wait_for_refusals_lingering_or_refused_during_it(guarded_worker, monkeypatch):
    """Nothing of a refused connection is served: the stop has nothing to wait for, whether
    it was refused before the stop or, its request let in still arriving, during it."""
    monkeypatch.setattr(http_protocol, "LINGER_QUIET_S", 30.0)
    monkeypatch.setattr(http_protocol, "LINGER_MAX_S", 30.0)
    worker = guarded_worker(header_timeout_s=1.0, max_header_bytes=4096)
    clients = [socket.create_connection(("127.0.0.1", worker.port), timeout=5) for _ in range(3)]
    try:
        for connection, opening in zip(clients, [TLS_HELLO, HEADER_ARRIVING, HEADER_ARRIVING + b"p" * 5000]):
            connection.sendall(opening)  # a 400, a 408 at the header deadline, a 431
        answers = [read_until_closed(connection)[:13] for connection in clients]
        assert wait_until(lambda: refusals_lingering(worker) == 3)
        clients.append(socket.create_connection(("127.0.0.1", worker.port), timeout=5))
        clients[3].sendall(HEADER_ARRIVING)  # let in by the stop; its 408 comes at the header deadline, 1 s on
        started = time.monotonic()
        worker.stop()  # uvicorn's graceful stop: each connection's shutdown(), then it waits for them to close
        took_s = time.monotonic() - started
        answers.append(read_until_closed(clients[3])[:13])
    finally:
        for connection in clients:
            connection.close()

    assert answers == [b"HTTP/1.1 400 ", b"HTTP/1.1 408 ", b"HTTP/1.1 431 ", b"HTTP/1.1 408 "]
    assert not worker.thread.is_alive() and took_s < 6


def test_a_client_that_disconnects_mid_body_enqueues_nothing(guarded_worker):
    worker = guarded_worker(body_timeout_s=30.0)
    document = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]})

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(head(length=len(document) + 1000) + document)  # valid JSON, but 1000 bytes short
        assert wait_until(lambda: worker.worker.app.in_flight == 1)

    assert wait_until(lambda: worker.worker.app.in_flight == 0)
    time.sleep(0.1)
    assert worker.runs == []


def test_keep_alive_requests_each_get_their_own_deadlines(guarded_worker):
    worker = guarded_worker(header_timeout_s=0.5, body_timeout_s=0.5)

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        for _ in range(3):
            time.sleep(0.3)  # idle between requests: under the keep-alive and header deadlines
            connection.sendall(head() + BODY)
            answer = b""
            while b'"model_version":"1"' not in answer:
                chunk = connection.recv(65536)  # each wait bounded by the socket's timeout
                assert chunk, "the server closed a keep-alive connection"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 ")


def fit_in_child(soft: int, hard: int, max_connections: int) -> tuple[int, int]:
    """fit_open_file_limit run in a child whose open-file limit is (soft, hard): the cap it
    returns and the soft limit it leaves. A child, because the limit is per process."""
    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
        "from serving.http_protocol import fit_open_file_limit\n"
        f"cap = fit_open_file_limit({max_connections})\n"
        "print(cap, resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    cap, left = done.stdout.split()
    return int(cap), int(left)


def test_the_open_file_limit_is_raised_to_fit_the_connection_cap():
    assert fit_in_child(1024, 8192, 4096) == (4096, 4096 + 256)


def test_the_connection_cap_is_lowered_to_fit_a_hard_open_file_limit():
    assert fit_in_child(1024, 1024, 4096) == (1024 - 256, 1024)


def test_the_listen_backlog_follows_the_connection_cap():
    assert listen_backlog(4096) == 4096
    assert listen_backlog(10_000) == 10_000
    assert listen_backlog(100) == 2048  # never shorter than uvicorn's own: a quick 503 beats a dropped SYN
    assert listen_backlog(0) == 65535  # no cap: as long as the kernel allows


# ---- an answer given before the body was read closes the connection (RFC 9112 §9.6) -----


def split_answers(data: bytes) -> list[tuple[bytes, bytes]]:
    """(lower-cased head, body) of each answer in ``data``, framed by content-length."""
    answers = []
    while data:
        head_part, separator, rest = data.partition(b"\r\n\r\n")
        assert separator, f"a partial answer: {data[:200]!r}"
        head_part = head_part.lower()
        length = next(int(line.split(b":", 1)[1]) for line in head_part.split(b"\r\n") if line.startswith(b"content-length:"))
        answers.append((head_part, rest[:length]))
        data = rest[length:]
    return answers


def whole_answer_in(data: bytes) -> bool:
    """Whether ``data`` holds an answer's head and its content-length body."""
    head_part, separator, body = data.partition(b"\r\n\r\n")
    if not separator:
        return False
    length = next(int(line.split(b":", 1)[1]) for line in head_part.lower().split(b"\r\n") if line.startswith(b"content-length:"))
    return len(body) >= length


def read_answer(connection: socket.socket, timeout_s: float = 5.0) -> bytes:
    """One whole answer (head and content-length body); fails, never hangs, past timeout_s."""
    deadline, answer = time.monotonic() + timeout_s, b""
    while True:
        if whole_answer_in(answer):
            return answer
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no whole answer within {timeout_s} s: {answer[:200]!r}"
        connection.settimeout(remaining)
        chunk = connection.recv(65536)
        assert chunk, f"closed after {answer[:200]!r}"
        answer += chunk


def test_expect_continue_refused_by_its_headers_gets_413_with_connection_close_and_the_connection_ends(guarded_worker):
    """The client waits for 100 Continue and gets a final status instead: it will not send
    the body, so the server must not wait for it (it did, until the 30 s body deadline)."""
    worker = guarded_worker(max_body_bytes=1000)

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        started = time.monotonic()
        connection.sendall(head(length=5000, extra="Expect: 100-continue\r\n"))
        answer = read_until_closed(connection, timeout_s=4)
        took_s = time.monotonic() - started

    [(head_part, body)] = split_answers(answer)
    assert head_part.startswith(b"http/1.1 413 ")
    assert b"connection: close" in head_part.split(b"\r\n")
    assert b"exceeds the limit of 1000" in body
    assert took_s < 3  # closed once answered (the linger ends at the client's silence), not at the body deadline
    assert worker.runs == []


def test_a_request_sent_after_an_early_refusal_is_never_read_as_its_body(guarded_worker):
    """RFC 9110 lets a client that got a final status skip the body it announced and reuse
    the connection: its next request must get an answer or a prompt close, never be taken
    for the body and wait out the body deadline."""
    worker = guarded_worker(max_body_bytes=1000)

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(head(length=5000, extra="Expect: 100-continue\r\n"))
        refusal = read_answer(connection)
        started = time.monotonic()
        try:
            connection.sendall(LIVE)
            after = read_until_closed(connection, timeout_s=4)
        except (BrokenPipeError, ConnectionResetError):
            after = b""  # closed already: as good
        took_s = time.monotonic() - started

    assert refusal.startswith(b"HTTP/1.1 413 ") and b"connection: close\r\n" in refusal.lower()
    assert after == b"" or after.startswith(b"HTTP/1.1 200 OK")
    assert took_s < 3


def test_a_small_body_sent_after_an_early_refusal_is_read_as_its_body_and_the_connection_serves_on(guarded_worker):
    """A client that sends its body after the 413 (no Expect): the bytes are read as that
    body and dropped, never answered as requests, and the connection stays in step: a
    refusal under overload costs no reconnect."""
    worker = guarded_worker(max_body_bytes=1000)
    smuggled = LIVE * 40  # a body that reads as requests

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(head(path="/v2/models/digits/infer", length=len(smuggled)))
        refusal = read_answer(connection)
        connection.sendall(smuggled + LIVE)
        after = read_answer(connection)
        connection.settimeout(0.5)
        with pytest.raises(TimeoutError):
            connection.recv(65536)  # nothing more: the body was not 40 requests

    assert refusal.startswith(b"HTTP/1.1 413 ") and b"connection: close" not in refusal.lower()
    assert after.startswith(b"HTTP/1.1 200 ") and after.endswith(b'{"live":true}')


def test_an_overload_refusal_before_the_whole_body_closes_the_connection(guarded_worker):
    """The body buffer's 503, given before the rest of the body is read: Connection: close,
    and the connection ends once answered."""
    worker = guarded_worker(max_body_buffer_bytes=1_500_000)

    with most_of_a_body_held(worker):
        with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as second:
            started = time.monotonic()
            second.sendall(head(LARGE_BODY_PATH, length=1_000_000) + b"[" * 700_000)
            answer = read_until_closed(second, timeout_s=4)
            took_s = time.monotonic() - started

    [(head_part, body)] = split_answers(answer)
    assert head_part.startswith(b"http/1.1 503 ")
    assert b"connection: close" in head_part.split(b"\r\n")
    assert b"SERVING_MAX_BODY_BUFFER_BYTES" in body
    assert took_s < 3


def test_a_body_arriving_in_a_later_read_keeps_the_connection_alive(guarded_worker):
    """The mark put on a request whose body is still arriving comes off once the body is
    whole: its answer keeps the connection, which serves the next request."""
    worker = guarded_worker()

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(head() + BODY[:10])
        time.sleep(0.2)  # the rest in a later read
        connection.sendall(BODY[10:])
        first = read_answer(connection)
        connection.sendall(LIVE)
        second = read_answer(connection)

    assert first.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in first.lower()
    assert second.startswith(b"HTTP/1.1 200 ") and second.endswith(b'{"live":true}')


# ---- graceful stop: what a connection pipelined before the close is answered -----------


def test_while_draining_pipelined_requests_are_each_answered_and_only_the_last_closes(guarded_worker):
    """Three inference requests in one write after the drain began: three answers, the
    last with Connection: close, then end of file. Before, every request was marked to
    close, the first answer closed the connection, and the two queued were dropped."""
    worker = guarded_worker()
    worker.worker.drain.begin()

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall((head() + BODY) * 3)
        answers = split_answers(read_until_closed(connection))

    assert [head_part.split(b"\r\n", 1)[0] for head_part, _ in answers] == [b"http/1.1 200 ok"] * 3
    assert [b"connection: close" in head_part.split(b"\r\n") for head_part, _ in answers] == [False, False, True]
    assert all(orjson.loads(body)["model_name"] == "digits" for _, body in answers)
    assert len(worker.runs) >= 1


@pytest.fixture
def slow_reading_server():
    """start(app, **limits) -> the port of a uvicorn server running ``app`` on this
    protocol, in a thread of its own; stopped at teardown."""
    started = []

    def start(app, **limits) -> int:
        port = free_port()
        protocol = http_protocol.protocol_class(http_protocol.HttpLimits(**limits), coalesce_writes=False)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, loop="asyncio", lifespan="off", log_level="warning",
                                               http=protocol))
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
        thread.start()
        started.append((server, thread))
        assert wait_until(lambda: server.started, 10)
        return port

    yield start
    for server, thread in started:
        server.should_exit = True
        thread.join(timeout=10)


def test_an_app_that_reads_after_the_body_deadline_sees_a_disconnect_not_an_error(slow_reading_server):
    """Refused with 408 while its client waited for 100 Continue, the request's app that
    asked for the body later made uvicorn write the 100 Continue after the lingering
    close's end of file: an error raised in the app, instead of its http.disconnect."""
    received = []

    async def reads_late(scope, receive, send):
        await asyncio.sleep(0.8)  # past the body deadline, before its first receive()
        try:
            received.append(await receive())
        except RuntimeError as error:  # "Cannot call write() after write_eof()"
            received.append(repr(error))

    port = slow_reading_server(reads_late, body_timeout_s=0.3)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(head(length=5000, extra="Expect: 100-continue\r\n"))
        answer = read_until_closed(connection, timeout_s=4)  # the 408, then the end of file: the linger began
        assert wait_until(lambda: received, 5)  # the client still there, as a slow one is, when the app reads

    assert answer.startswith(b"HTTP/1.1 408 ")
    assert received == [{"type": "http.disconnect"}]


H2C = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize("split_at", [None, 10], ids=["body with the head", "body in a later read"])
def test_a_request_asking_for_h2c_is_answered_over_http1_with_its_body(digits_worker, split_at):
    # `curl --http2 -d …` on http://: httptools skipped the body of a request asking to
    # upgrade, and the worker answered 400 "empty document".
    request = head(length=len(BODY), extra=H2C)
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        if split_at is None:
            connection.sendall(request + BODY)
        else:
            connection.sendall(request + BODY[:split_at])
            time.sleep(0.2)
            connection.sendall(BODY[split_at:])
        answer = read_until_closed(connection)

    [(head_part, body)] = split_answers(answer)
    assert head_part.startswith(b"http/1.1 200 ") and b"connection: close" in head_part.split(b"\r\n")
    assert orjson.loads(body)["outputs"][0]["name"] == "probabilities"


def test_a_chunked_body_asking_for_an_upgrade_is_a_400_naming_the_way_out(digits_worker):
    request = (f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n{H2C}\r\n").encode()
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        connection.sendall(request + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n")
        answer = read_until_closed(connection)

    assert answer.startswith(b"HTTP/1.1 400 ") and b"cannot come with an Upgrade header" in answer


@pytest.mark.parametrize("later", [b"junk\r\n\r\n", f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n{H2C}\r\n".encode()],
                         ids=["garbage", "another upgrade request"])
def test_what_follows_an_upgrade_request_in_a_later_read_is_dropped_not_parsed(digits_worker, later):
    # Parsed as a new request, a tail made the answer a 400 "invalid HTTP request", and a
    # second request gave the first its keep-alive back.
    version = digits_worker.worker.repository.loaded[("digits", 1)]
    held = version.engine.run = HeldRun(version.engine.run)  # the answer waits while more bytes come
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        try:
            connection.sendall(head(length=len(BODY), extra=H2C) + BODY)
            assert held.entered.wait(5)
            connection.sendall(later)
            time.sleep(0.2)  # read by the worker while its answer is held
        finally:
            held.release.set()
        answer = read_until_closed(connection)

    [(head_part, _)] = split_answers(answer)
    assert head_part.startswith(b"http/1.1 200 ") and b"connection: close" in head_part.split(b"\r\n")


def test_the_keep_alive_timeout_leaves_open_a_connection_whose_next_request_is_waiting(digits_worker):
    """A loop held past the keep-alive timeout runs the timer before it reads (uvloop runs
    timers first): the close came with the request unread, a reset that lost it. Here the
    timer's handler runs while the request waits, before the loop could read it."""
    request = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n\r\n".encode() + BODY
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        connection.sendall(request)
        assert first_bytes(connection).startswith(b"HTTP/1.1 200 ")
        [protocol] = digits_worker.server.server_state.connections
        sent, held = threading.Event(), threading.Event()

        def timeout_with_the_request_waiting():
            held.set()
            assert sent.wait(5)
            time.sleep(0.05)  # in the kernel's buffer, not read: the loop is here
            protocol.timeout_keep_alive_handler()

        digits_worker.loop.call_soon_threadsafe(timeout_with_the_request_waiting)
        assert held.wait(5)
        connection.sendall(request)
        sent.set()
        answer = read_for(connection, 5.0)

    assert answer.startswith(b"HTTP/1.1 200 ")


def test_the_keep_alive_timeout_still_closes_an_idle_connection(digits_worker):
    request = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n\r\n".encode() + BODY
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        connection.sendall(request)
        assert first_bytes(connection).startswith(b"HTTP/1.1 200 ")
        [protocol] = digits_worker.server.server_state.connections
        digits_worker.loop.call_soon_threadsafe(protocol.timeout_keep_alive_handler)

        assert read_until_closed(connection) == b""


def test_a_client_that_half_closes_after_its_request_reads_the_answer(digits_worker):
    """uvicorn closed the connection at the end of file, and the answer was lost."""
    request = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n\r\n".encode() + BODY
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        connection.sendall(request + request)
        connection.shutdown(socket.SHUT_WR)
        answer = read_until_closed(connection)

    assert answers_in(answer) == 2
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1 200 ") == 2
    assert answer.count(b"connection: close") == 1  # the last answer says the connection ends


def test_a_client_that_half_closes_inside_its_body_is_closed_and_nothing_runs(guarded_worker):
    worker = guarded_worker()
    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(head() + BODY[:20])
        connection.shutdown(socket.SHUT_WR)
        answer = read_until_closed(connection)

    assert answer == b""
    assert wait_until(lambda: worker.worker.app.in_flight == 0)
    assert worker.runs == []


@pytest.mark.parametrize("valid", [1, 2])
def test_requests_pipelined_ahead_of_garbage_are_answered_before_its_400(digits_worker, valid):
    """The 400 for what the parser rejected dropped the answers of the valid requests read
    before it in the same write."""
    request = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n\r\n".encode() + BODY
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        connection.sendall(request * valid + b"GARBAGE \x00\x01 NOT HTTP\r\n\r\n")
        answer = read_until_closed(connection)

    statuses = re.findall(rb"HTTP/1\.1 \d{3} [A-Za-z ]+", answer)
    assert statuses == [b"HTTP/1.1 200 OK"] * valid + [b"HTTP/1.1 400 Bad Request"]
    assert answer.endswith(b'{"error":"invalid HTTP request"}')


def test_garbage_inside_a_body_still_being_read_is_refused_at_once(guarded_worker):
    worker = guarded_worker()
    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(CHUNKED + b"zz\r\n")
        answer = read_until_closed(connection)

    assert answer.startswith(b"HTTP/1.1 400 ")
    assert worker.runs == []


def test_a_crlf_after_an_answer_does_not_keep_the_connection_open_for_good(guarded_worker):
    """llhttp skips CRLFs before a request line: they began no request, yet cancelled the
    keep-alive timer, and the connection had no timer at all (300 held 300 open files)."""
    worker = guarded_worker(header_timeout_s=0.5)
    request = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n\r\n".encode() + BODY
    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(request)
        assert first_bytes(connection).startswith(b"HTTP/1.1 200 ")
        connection.sendall(b"\r\n")
        started = time.monotonic()
        rest = read_until_closed(connection)

    assert rest == b""  # closed quietly: CRLFs are no request to refuse
    assert time.monotonic() - started < 3


def test_a_chunked_body_answered_before_it_arrived_is_not_read_on_past_the_unread_bound(guarded_worker):
    """Answered at its headers (415), a chunked body was read on, to be dropped, under no
    bound but the body deadline: 33.9 GB in 20 s on one connection."""
    worker = guarded_worker(body_timeout_s=30)
    opening = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(opening)
        assert first_bytes(connection).startswith(b"HTTP/1.1 415 ")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(4):  # past UNREAD_BODY_READ_UP_TO, then quiet
                connection.sendall(chunk)
                time.sleep(0.01)
        started = time.monotonic()
        read_until_closed(connection)

    assert time.monotonic() - started < http_protocol.LINGER_QUIET_S + 2
    assert worker.runs == []


def test_a_chunked_body_answered_early_that_ends_in_the_read_past_the_unread_bound_keeps_its_connection(guarded_worker):
    """Its answer said keep-alive; uvicorn left the request marked as still receiving, so the
    read that ended the body past UNREAD_BODY_READ_UP_TO ended the connection, and the
    client's next request on it was dropped unanswered."""
    worker = guarded_worker()
    opening = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(opening)
        answer = first_bytes(connection)
        assert answer.startswith(b"HTTP/1.1 415 ") and b"connection: close" not in answer
        connection.sendall(b"a000\r\n" + b"x" * 0xA000 + b"\r\n")
        time.sleep(0.2)
        connection.sendall(b"7800\r\n" + b"x" * 0x7800 + b"\r\n0\r\n\r\n")
        time.sleep(0.2)
        connection.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert first_bytes(connection).startswith(b"HTTP/1.1 200 ")


def test_an_idle_connection_after_an_early_answered_body_keeps_the_keep_alive_timeout_not_the_body_deadline(guarded_worker):
    worker = guarded_worker(body_timeout_s=0.5)
    opening = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(opening)
        assert first_bytes(connection).startswith(b"HTTP/1.1 415 ")
        connection.sendall(b"5\r\nhello\r\n0\r\n\r\n")
        time.sleep(1.0)  # past the body deadline, inside the keep-alive timeout
        connection.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert first_bytes(connection).startswith(b"HTTP/1.1 200 ")


def test_a_refusal_given_after_pipelined_answers_lingers_without_the_keep_alive_timer(digits_worker):
    """uvicorn armed its keep-alive timer after the last answer, and that timer would close
    the connection in the middle of the refusal's lingering close."""
    request = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n\r\n".encode() + BODY
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        connection.sendall(request * 2 + b"GARBAGE \x00\x01 NOT HTTP\r\n\r\n")
        # Read when it is first seen lingering: after LINGER_QUIET_S of silence it closes, and a
        # loaded box once looked for it again only after that (one flaky failure in 1,447).
        timers = []

        def lingering() -> bool:
            timers[:] = [protocol.timeout_keep_alive_task for protocol in list(digits_worker.server.server_state.connections)
                         if protocol._lingering]
            return bool(timers)

        assert wait_until(lingering, timeout_s=5)

    assert timers == [None]


# ---- framing headers: what RFC 9110 and 9112 allow is read, what the worker cannot read is refused ----

BINARY_HEADER = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                          "parameters": {"binary_data_size": 256}}]})


def test_a_content_length_padded_with_spaces_and_tabs_is_read_as_its_number(digits_worker):
    """RFC 9110 allows optional whitespace around a field value; httptools frames the body by it."""
    request = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: \t {len(BODY)} \t\r\n\r\n".encode() + BODY
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        connection.sendall(request)
        answer = read_answer(connection)

    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b'"model_name":"digits"' in answer


def test_an_inference_header_content_length_padded_with_spaces_and_tabs_is_read_as_its_number(digits_worker):
    content = BINARY_HEADER + np.zeros((1, 64), np.float32).tobytes()
    request = (f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
               f"Content-Length: {len(content)}\r\nInference-Header-Content-Length: \t {len(BINARY_HEADER)} \t\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        connection.sendall(request + content)
        answer = read_answer(connection)

    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b'"model_name":"digits"' in answer


def test_a_number_with_whitespace_inside_it_is_still_a_400(digits_worker):
    request = (f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n"
               f"Inference-Header-Content-Length: 1 2\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        connection.sendall(request + BODY)
        answer = read_answer(connection)

    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"Inference-Header-Content-Length must be a non-negative integer" in answer


def test_a_transfer_coding_other_than_chunked_is_a_501_naming_it_and_the_connection_ends(guarded_worker):
    """RFC 9112 §6.1: a transfer coding the server does not understand is a 501. Read as
    plain chunked, a gzipped body was a 400 "not valid UTF-8" and a plain one was served.
    What follows it cannot be framed, so the request pipelined behind it is not answered."""
    worker = guarded_worker()
    opening = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(opening + in_chunks(gzip.compress(BODY), 1000) + LIVE)
        answer = read_until_closed(connection)

    assert answer.startswith(b"HTTP/1.1 501 ")
    assert b"Transfer-Encoding 'gzip' is not supported" in answer
    assert b"connection: close" in answer.lower()
    assert answer.count(b"HTTP/1.1 ") == 1
    assert worker.runs == []


def test_requests_pipelined_ahead_of_an_unknown_transfer_coding_are_answered_before_its_501(digits_worker):
    opening = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: br, chunked\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", digits_worker.port), timeout=5) as connection:
        connection.sendall(LIVE * 2 + opening + in_chunks(BODY, 1000))
        answer = read_until_closed(connection)

    assert answer.count(b'{"live":true}') == 2
    assert answer.rsplit(b"HTTP/1.1 ", 1)[1].startswith(b"501 ")


# ---- the send deadline: a client that never reads its answers ------------------------

# Answers as wide as their requests (relu): 16 of them outgrow what loopback's kernel buffers hold (4 MB).
WIDE_BODY = orjson.dumps(v2_body(np.zeros((1, 90_000), np.float32)))


@contextlib.contextmanager
def never_reading_client(worker, receive_buffer_bytes: int = 1024, connections_before: int = 0, body: bytes = WIDE_BODY, count: int = 16):
    """A client with a tiny receive buffer that pipelines ``count`` wide requests (``body``) and never
    reads an answer: the kernel's buffers fill, then the worker's, and its writes pause.
    Yields once the worker stops taking its requests, or has cut the connection (1 s at most)."""
    connection = socket.socket()
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
    connection.connect(("127.0.0.1", worker.port))
    try:
        assert wait_until(lambda: len(worker.server.server_state.connections) == connections_before + 1)
        connection.setblocking(False)
        requests, sent, deadline = (head(LARGE_BODY_PATH, length=len(body)) + body) * count, 0, time.monotonic() + 1
        while time.monotonic() < deadline and sent < len(requests):
            try:
                sent += connection.send(memoryview(requests)[sent:])
            except BlockingIOError:  # the worker reads no more while its answers wait on this client
                time.sleep(0.01)
            except (ConnectionResetError, BrokenPipeError):  # cut already (a small budget is over at the first pause)
                break
        yield connection
    finally:
        connection.close()


def test_a_client_that_never_reads_its_answers_is_closed_at_the_send_deadline_and_frees_its_slot(guarded_worker, client):
    """Before, an answer waited for its client to read for good: such clients held every
    slot of the connection cap, and every other client got 503 for as long as they liked."""
    worker = guarded_worker(send_timeout_s=1.0, max_connections=1)

    with never_reading_client(worker):
        assert wait_until(lambda: not worker.server.server_state.connections, timeout_s=6)
        answer = client.get(worker.url + "/v2/health/live")

    assert answer.status_code == 200


def test_a_client_cut_for_not_reading_gets_a_reset_not_a_close_queued_behind_its_answers(guarded_worker):
    """Closed plainly, a client whose requests were all read got its FIN queued behind the
    answers the kernel still held for it (1.6 MB seen), kept in FIN-WAIT-1 outside the
    unsent budget, and it never learned it was cut: reading on, it got answers, then an end."""
    worker = guarded_worker(send_timeout_s=1.0)

    with never_reading_client(worker, body=MID_BODY, count=30) as connection:
        assert wait_until(lambda: not worker.server.server_state.connections, timeout_s=6)
        connection.setblocking(True)
        connection.settimeout(5)
        with pytest.raises(ConnectionResetError):
            while connection.recv(65536):
                pass


def test_a_connection_closed_at_the_send_deadline_is_logged(guarded_worker, caplog):
    caplog.set_level(logging.WARNING, logger="serving.http")
    worker = guarded_worker(send_timeout_s=1.0)

    with never_reading_client(worker):
        assert wait_until(lambda: not worker.server.server_state.connections, timeout_s=6)

    [line] = [orjson.loads(record.getMessage()) for record in caplog.records if "send_timeout" in record.getMessage()]
    assert line["event"] == "send_timeout" and line["timeout_s"] == 1.0


def test_a_client_that_reads_its_answers_slowly_is_served_past_the_send_deadline(guarded_worker):
    """The deadline runs while the client takes nothing, not over the answers: read at
    1 MB/s, what the kernel holds for it (megabytes) takes seconds to leave, and nothing is cut."""
    worker = guarded_worker(send_timeout_s=1.0)
    answers = b""

    with never_reading_client(worker, receive_buffer_bytes=64 * 1024) as connection:
        connection.setblocking(True)
        connection.settimeout(5)
        started = time.monotonic()
        while answers.count(b"HTTP/1.1 200 OK") < 16 or not answers.endswith(b"}"):
            chunk = connection.recv(65536)
            assert chunk, f"closed after {answers.count(b'HTTP/1.1 200 OK')} answers"
            answers += chunk
            time.sleep(len(chunk) / 1e6)

    assert time.monotonic() - started > 2 * worker.worker.config.send_timeout_s


# Answers of 100 KB, 30 pipelined: more than the kernel takes for a client that reads
# nothing, so its writes pause. They pause once the worker holds more than uvloop's
# high-water mark for it (64 KiB), and it writes no more: a paused client holds 64 KiB to
# 64 KiB and one answer (166 KB); three, more than three times the mark.
MID_BODY = orjson.dumps(v2_body(np.zeros((1, 25_000), np.float32)))
HIGH_WATER_BYTES = 64 * 1024


def test_past_the_unsent_budget_the_clients_paused_longest_are_cut_long_before_their_send_deadline(guarded_worker, client, caplog):
    """The send deadline runs between reads: clients reading a little every few seconds
    kept their answers in the worker's memory for good (64 such: 1 GB)."""
    caplog.set_level(logging.WARNING, logger="serving.http")
    budget = 3 * HIGH_WATER_BYTES  # above one client's hold, below three clients'
    worker = guarded_worker(max_unsent_bytes=budget, send_timeout_s=60.0)

    with contextlib.ExitStack() as clients:
        stalled = []
        for _ in range(3):
            stalled.append(clients.enter_context(never_reading_client(
                worker, connections_before=len(worker.server.server_state.connections), body=MID_BODY, count=30)))
            assert wait_until(lambda: all_paused(worker), timeout_s=5)
        oldest, newest = (connection.getsockname()[1] for connection in (stalled[0], stalled[-1]))
        # Seen from the worker: a client whose requests were all read gets no reset when
        # cut, only a FIN queued behind what the kernel still holds for it, never sent.
        assert wait_until(lambda: oldest not in client_ports(worker), timeout_s=5)
        assert newest in client_ports(worker)
        answer = client.post(worker.url + INFER, content=BODY, headers={"content-type": "application/json"})

    assert answer.status_code == 200  # a client reading its answers is never paused, nor cut
    cuts = [orjson.loads(record.getMessage()) for record in caplog.records if "unsent_over_budget" in record.getMessage()]
    assert {line["max_unsent_bytes"] for line in cuts} == {budget} and len(cuts) <= 2  # the newest is within it alone
    assert cuts[0]["client"] == f"127.0.0.1:{oldest}"


def all_paused(worker) -> bool:
    """Every open connection's writes are paused, the worker holding over the mark for it."""
    return all(protocol.transport.get_write_buffer_size() > HIGH_WATER_BYTES for protocol in list(worker.server.server_state.connections))


def client_ports(worker) -> set[int]:
    """The client ports of the worker's open connections."""
    return {protocol.client[1] for protocol in list(worker.server.server_state.connections)}


@pytest.mark.parametrize("field", [b"X-Request-Timeout-S: 0.000001", b"Content-Encoding: gzip", b"Inference-Header-Content-Length: 5"])
def test_a_chunked_body_s_trailer_fields_are_not_read_as_its_headers(guarded_worker, field):
    """uvicorn appends trailer fields to the request's header list, which the app reads once
    the whole request has arrived in one read: a trailer's X-Request-Timeout-S made a 504, and
    its Content-Encoding or Inference-Header-Content-Length changed how the body was read,
    where a proxy in front forwarding the trailer had checked only the headers
    (RFC 9110 §6.5.1: a trailer field is never merged into the header section)."""
    worker = guarded_worker()

    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
        connection.sendall(chunked_close() + in_chunks(BODY, len(BODY))[:-2] + field + b"\r\n\r\n")
        answer = read_until_closed(connection)

    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert worker.runs == [1]
