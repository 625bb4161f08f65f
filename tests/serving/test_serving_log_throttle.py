"""A warning a client can cause once per request is written at most a few times a window
from each place in the code, and the next line written from there says how many were held back."""

from __future__ import annotations

import io
import logging
import socket

import orjson
from serving_testkit import SubprocessWorker, route, state, write_state

from serving.log_throttle import BURST, MAX_MESSAGE_CHARS, RepeatThrottle, SuppressedFormatter
from serving.logs import JsonFormatter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(line: int, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("serving.http", level, "/srv/serving/http_protocol.py", line, "Invalid HTTP request received.", (), None)


def test_a_flood_from_one_line_of_code_passes_only_the_burst_in_a_window():
    throttle = RepeatThrottle(burst=5, window_s=10, clock=Clock())

    passed = [throttle.filter(record(108)) for _ in range(1000)]

    assert passed.count(True) == 5 and passed[:5] == [True] * 5


def test_the_first_line_of_the_next_window_says_how_many_were_held_back():
    clock = Clock()
    throttle = RepeatThrottle(burst=5, window_s=10, clock=clock)
    for _ in range(1000):
        throttle.filter(record(108))

    clock.now += 10
    next_line = record(108)

    assert throttle.filter(next_line)
    assert next_line.suppressed == 995
    assert orjson.loads(JsonFormatter().format(next_line))["suppressed"] == 995
    assert SuppressedFormatter().format(next_line).endswith("[995 more like this were not logged]")


def test_a_line_after_a_quiet_window_carries_no_count():
    clock = Clock()
    throttle = RepeatThrottle(burst=5, window_s=10, clock=clock)
    throttle.filter(record(108))
    clock.now += 10
    line = record(108)

    assert throttle.filter(line)
    assert not hasattr(line, "suppressed")
    assert "suppressed" not in orjson.loads(JsonFormatter().format(line))


def test_other_lines_of_code_are_not_held_back_by_a_flood_from_one():
    throttle = RepeatThrottle(burst=5, window_s=10, clock=Clock())
    for _ in range(1000):
        throttle.filter(record(108))

    assert throttle.filter(record(240))
    assert throttle.filter(record(108, logging.ERROR))  # another level is another line


def test_debug_and_info_lines_are_never_held_back():
    throttle = RepeatThrottle(burst=5, window_s=10, clock=Clock())

    assert all(throttle.filter(record(108, logging.DEBUG)) for _ in range(100))
    assert all(throttle.filter(record(109, logging.INFO)) for _ in range(100))


def test_a_long_message_is_cut_and_says_how_much_was_cut():
    line = logging.LogRecord("django.security.csrf", logging.WARNING, __file__, 1, "Forbidden: %s", ("/" + "a" * 8000,), None)

    assert RepeatThrottle().filter(line)

    assert line.getMessage() == "Forbidden: /" + "a" * (MAX_MESSAGE_CHARS - 12) + "… (6012 characters cut)"


def malformed_request(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        return connection.recv(4096)


def test_a_worker_flooded_with_malformed_requests_logs_only_a_few_lines(tmp_path, mlp_v1):
    state_file = write_state(tmp_path / "state.json", state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}))
    worker = SubprocessWorker(state_file, tmp_path).wait_ready()
    try:
        answers = [malformed_request(worker.port) for _ in range(300)]
    finally:
        worker.stop()

    assert all(answer.startswith(b"HTTP/1.1 400 ") for answer in answers)
    lines = [orjson.loads(text) for text in worker.process.stderr.read().decode().splitlines() if text]
    invalid = [line for line in lines if "Invalid HTTP request" in line.get("message", "")]
    assert 1 <= len(invalid) <= BURST


def test_the_throttle_keeps_a_logger_flood_in_one_process_to_the_burst():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RepeatThrottle())
    logger = logging.getLogger("tests.throttle")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for _ in range(500):
            logger.warning("batch of %d requests failed; run again in parts", 8)
    finally:
        logger.removeHandler(handler)

    assert len(stream.getvalue().splitlines()) == BURST
