"""The coalescing protocol sends each response in one write and changes nothing else."""

from __future__ import annotations

import socket

from serving.http_protocol import CoalescingTransport


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
                answer += connection.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200 OK")
