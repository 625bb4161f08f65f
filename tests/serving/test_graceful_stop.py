"""SIGTERM to a worker process (`python -m serving.worker`): not ready at once, still
serving through SERVING_DRAIN_DELAY_S, then no new connection, every accepted request
answered within SERVING_DRAIN_TIMEOUT_S (503 past it), and exit status 0."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from serving_testkit import (
    SubprocessWorker,
    route,
    state,
    v2_body,
    write_model,
    write_state,
)

from registry.building.onnx_build import random_mlp
from serving.drain import complete_no_more_handshakes

ROW = np.ones((1, 64), np.float32)
BODY = json.dumps(v2_body(ROW)).encode()
INFER = "/v2/models/digits/infer"
MARGIN_S = 3.0  # start-up of the interpreter's exit, a loaded machine's scheduling


def start(tmp_path, mlp_v1, *, max_queue_delay_s: float = 0.002, **env) -> SubprocessWorker:
    desired = state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}, max_queue_delay_s=max_queue_delay_s)
    worker = SubprocessWorker(write_state(tmp_path / "state.json", desired), tmp_path, **env)
    return worker.wait_ready()


def exit_within(worker: SubprocessWorker, timeout_s: float) -> tuple[int, float, list[dict]]:
    """The exit status, the seconds it took, and the worker's structured log lines."""
    started = time.monotonic()
    try:
        status = worker.process.wait(timeout=timeout_s)
    except Exception:
        worker.process.kill()
        raise
    lines = [json.loads(line) for line in worker.process.stderr.read().decode().splitlines() if line.startswith("{")]
    return status, time.monotonic() - started, lines


def events(lines: list[dict], name: str) -> list[dict]:
    return [line for line in lines if line.get("event") == name]


def test_readiness_turns_503_at_once_while_inference_still_answers_during_the_delay(tmp_path, mlp_v1):
    worker = start(tmp_path, mlp_v1, SERVING_DRAIN_DELAY_S="2", SERVING_DRAIN_TIMEOUT_S="2")
    try:
        worker.process.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        ready = httpx.get(f"{worker.url}/v2/health/ready", timeout=2)
        model_ready = httpx.get(f"{worker.url}/v2/models/digits/ready", timeout=2)
        answer = httpx.post(worker.url + INFER, content=BODY, headers={"content-type": "application/json"}, timeout=2)
        status, took_s, lines = exit_within(worker, 2 + 2 + MARGIN_S)
    finally:
        worker.stop()

    assert (ready.status_code, ready.json()) == (503, {"ready": False, "draining": True})
    assert (model_ready.status_code, model_ready.json()) == (503, {"ready": False, "draining": True})
    assert answer.status_code == 200 and answer.headers["connection"] == "close"
    assert status == 0 and took_s >= 1.5
    assert [bool(events(lines, name)) for name in ("drain_started", "stopped_accepting", "drained", "worker_exit")] == [True] * 4
    assert events(lines, "drained")[0]["cut"] == 0


class Client(threading.Thread):
    """Keep-alive requests in a loop until the worker refuses the connection; a failure
    after connecting (a reset, an empty answer) is a dropped request."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.statuses: list[int] = []
        self.dropped: list[str] = []

    def run(self) -> None:
        deadline, connection = time.monotonic() + 15, None
        while time.monotonic() < deadline:
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                try:
                    connection.connect()
                except ConnectionRefusedError:
                    return  # the listener is closed: not accepted, so nothing to answer
            try:
                connection.request("POST", INFER, BODY, {"content-type": "application/json"})
                response = connection.getresponse()
                response.read()
            except (OSError, http.client.HTTPException) as error:
                self.dropped.append(repr(error))
                return
            self.statuses.append(response.status)
            if response.getheader("connection") == "close":
                connection.close()
                connection = None


def test_under_load_every_accepted_request_is_answered_and_the_worker_exits_0(tmp_path, mlp_v1):
    worker = start(tmp_path, mlp_v1, SERVING_DRAIN_DELAY_S="1", SERVING_DRAIN_TIMEOUT_S="3")
    clients = [Client(worker.port) for _ in range(6)]
    try:
        for client in clients:
            client.start()
        time.sleep(0.5)
        before = sum(len(client.statuses) for client in clients)
        worker.process.send_signal(signal.SIGTERM)
        status, _, lines = exit_within(worker, 1 + 3 + MARGIN_S)
        for client in clients:
            client.join(10)
    finally:
        worker.stop()

    answered = sum(len(client.statuses) for client in clients)
    assert [error for client in clients for error in client.dropped] == []
    assert {code for client in clients for code in client.statuses} == {200}
    assert answered > before + 10  # served through the delay, under load
    assert not any(client.is_alive() for client in clients)  # each ended on a refused connection
    assert status == 0
    assert events(lines, "drained")[0]["cut"] == 0


@pytest.fixture(scope="module")
def slow_mlp(model_dir):
    """About 50 ms a batch of 256 rows on one thread on a fast machine, where hidden layers
    of 2,048 took 12 ms (60 ms on a slower one): a burst keeps its batcher's queue full."""
    return write_model(model_dir, "slow_mlp", random_mlp([64, 4096, 4096, 10], seed=3))


def test_requests_queued_in_a_batcher_at_sigterm_are_answered(tmp_path, slow_mlp):
    desired = state(1, {"digits": {"routes": [route(1, 100, *slow_mlp)]}}, max_batch_size=256)
    worker = SubprocessWorker(write_state(tmp_path / "state.json", desired), tmp_path,
                              SERVING_DRAIN_DELAY_S="0", SERVING_DRAIN_TIMEOUT_S="10").wait_ready(90)  # a large model: 26 s to ready seen under load
    body = json.dumps(v2_body(np.ones((256, 64), np.float32))).encode()
    answers: list[int] = []

    def send() -> None:
        answers.append(httpx.post(worker.url + INFER, content=body, headers={"content-type": "application/json"}, timeout=10).status_code)

    # 16 batches: 8 or more still queued when the stop begins, at least 0.36 s of work, so
    # the queue cannot empty before uvicorn notices the signal on its next 0.1 s tick.
    senders = [threading.Thread(target=send) for _ in range(16)]
    try:
        for sender in senders:
            sender.start()
        assert wait_for_queue_depth(worker, 8)
        worker.process.send_signal(signal.SIGTERM)
        status, _, lines = exit_within(worker, 10 + MARGIN_S)
        for sender in senders:
            sender.join(10)
    finally:
        worker.stop()

    assert answers == [200] * 16
    assert status == 0
    assert events(lines, "stopped_accepting")[0]["in_flight"] >= 1
    assert events(lines, "drained")[0]["cut"] == 0


def wait_for_queue_depth(worker: SubprocessWorker, depth: int, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        health = httpx.get(f"{worker.url}/health", timeout=1).json()
        if sum(health["models"]["digits"]["queue_depth"].values()) >= depth:
            return True
        time.sleep(0.02)
    return False


def test_past_the_drain_timeout_a_stuck_request_gets_503_and_the_worker_exits_in_bounded_time(tmp_path, mlp_v1):
    worker = start(tmp_path, mlp_v1, SERVING_DRAIN_DELAY_S="0", SERVING_DRAIN_TIMEOUT_S="1")
    try:
        with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as stuck:
            # Headers and the start of a body that never completes: accepted, never answerable.
            stuck.sendall(b"POST " + INFER.encode() + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                          b"content-length: 1000\r\n\r\n{\"inputs\"")
            time.sleep(0.2)
            worker.process.send_signal(signal.SIGTERM)
            answer = read_all(stuck)
        status, _, lines = exit_within(worker, 1 + MARGIN_S)
    finally:
        worker.stop()

    assert answer.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in answer.lower()
    assert b"the worker stopped before this request was answered" in answer
    assert status == 1
    assert events(lines, "drained")[0]["cut"] == 1


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_client_refused_at_the_cap_and_still_sending_does_not_hold_the_stop(tmp_path, mlp_v1):
    """A refusal lingers up to 5 s while its client sends; nothing of it is served, so a
    graceful stop closes it at once rather than wait."""
    worker = start(tmp_path, mlp_v1, SERVING_MAX_CONNECTIONS="1", SERVING_DRAIN_DELAY_S="0")
    held, refused = None, None
    try:
        held = connection_served(worker.port)  # kept alive: the cap's one slot
        refused = socket.create_connection(("127.0.0.1", worker.port), timeout=5)
        refused.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n".encode())
        assert refused.recv(64).startswith(b"HTTP/1.1 503 ")
        worker.process.send_signal(signal.SIGTERM)
        sending = threading.Thread(target=send_until_closed, args=(refused,), daemon=True)
        sending.start()
        status, took_s, _ = exit_within(worker, 10)
    finally:
        for connection in (held, refused):
            connection is not None and connection.close()
        worker.stop()

    assert status == 0 and took_s < 2.5


def connection_served(port: int) -> http.client.HTTPConnection:
    """A kept-alive connection whose request was served (the readiness probe's connection
    may not be closed on the worker's side yet, and take the cap's slot for a moment)."""
    for _ in range(50):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("POST", INFER, BODY, {"content-type": "application/json"})
        response = connection.getresponse()
        response.read()
        if response.status == 200:
            return connection
        connection.close()
        time.sleep(0.05)
    raise AssertionError("no request served on a connection of its own")


def send_until_closed(connection: socket.socket) -> None:
    try:
        for _ in range(200):
            connection.sendall(b"[" * 1000)
            time.sleep(0.05)
    except OSError:
        pass


def test_a_second_sigterm_ends_the_drain_at_once(tmp_path, mlp_v1):
    worker = start(tmp_path, mlp_v1, SERVING_DRAIN_DELAY_S="30", SERVING_DRAIN_TIMEOUT_S="30")
    try:
        worker.process.send_signal(signal.SIGTERM)
        assert wait_for_status(f"{worker.url}/v2/health/ready", 503)
        worker.process.send_signal(signal.SIGTERM)
        status, _, lines = exit_within(worker, MARGIN_S)
    finally:
        worker.stop()

    assert status == -signal.SIGTERM
    assert events(lines, "drained")[0]["forced"] is True


def wait_for_status(url: str, status: int, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(url, timeout=1).status_code == status:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("raw", ["-1", "soon"])
def test_a_bad_drain_delay_is_refused_at_start(tmp_path, mlp_v1, raw):
    desired = state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}})
    worker = SubprocessWorker(write_state(tmp_path / "state.json", desired), tmp_path, SERVING_DRAIN_DELAY_S=raw)
    try:
        status = worker.process.wait(timeout=30)
        message = worker.process.stderr.read().decode()
    finally:
        worker.stop()

    assert status != 0 and "SERVING_DRAIN_DELAY_S" in message


@pytest.mark.skipif(sys.platform != "linux", reason="socket filters are Linux's")
def test_a_listener_closed_to_new_handshakes_still_hands_over_its_backlog():
    with socket.create_server(("127.0.0.1", 0), backlog=16) as listener:
        port = listener.getsockname()[1]
        waiting = socket.create_connection(("127.0.0.1", port), timeout=2)
        complete_no_more_handshakes(listener)
        late = socket.socket()
        late.settimeout(0.3)
        try:
            with pytest.raises(TimeoutError):  # its SYN goes unanswered: it never believes it is connected
                late.connect(("127.0.0.1", port))
            accepted, peer = listener.accept()
            accepted.close()
            assert peer == waiting.getsockname()  # the connection completed before is still there to take
            listener.setblocking(False)
            with pytest.raises(BlockingIOError):
                listener.accept()
        finally:
            waiting.close()
            late.close()


@pytest.mark.skipif(sys.platform != "linux", reason="socket filters are Linux's")
def test_closing_a_listener_to_new_handshakes_leaves_its_accepted_connections_working():
    with socket.create_server(("127.0.0.1", 0), backlog=16) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=2)
        accepted, _ = listener.accept()
        complete_no_more_handshakes(listener)
        with client, accepted:
            client.sendall(b"ping")
            accepted.settimeout(2)
            assert accepted.recv(4) == b"ping"
            accepted.sendall(b"pong")
            assert client.recv(4) == b"pong"


def test_requests_pipelined_during_the_delay_are_all_answered_the_last_with_connection_close(tmp_path, mlp_v1):
    """After SIGTERM a client that pipelines three requests on one connection gets three
    answers, the last saying Connection: close, then end of file: every request the worker
    read is answered (the first answer used to close the connection and drop the rest)."""
    worker = start(tmp_path, mlp_v1, SERVING_DRAIN_DELAY_S="1", SERVING_DRAIN_TIMEOUT_S="2")
    request = (f"POST {INFER} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
               f"content-length: {len(BODY)}\r\n\r\n").encode() + BODY
    try:
        worker.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as connection:
            connection.sendall(request * 3)
            answer = read_all(connection)
        status, _, lines = exit_within(worker, 1 + 2 + MARGIN_S)
    finally:
        worker.stop()

    heads = [part.split(b"\r\n\r\n", 1)[0].lower() for part in answer.split(b"HTTP/1.1 ")[1:]]
    assert [head.split(b"\r\n", 1)[0] for head in heads] == [b"200 ok"] * 3, answer[:600]
    assert [b"connection: close" in head.split(b"\r\n") for head in heads] == [False, False, True]
    assert status == 0
    assert events(lines, "drained")[0]["cut"] == 0
