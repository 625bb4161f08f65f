"""Every worker log line is one JSON object — ts (ISO 8601, UTC), level, logger, then the
record's own fields or its message, and exc — under ``python -m serving.worker`` and
under ``manage.py serve``, where Django's LOGGING was configured first. Batches are not
logged at INFO."""

from __future__ import annotations

import io
import logging
import logging.config
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from types import SimpleNamespace

import httpx
import numpy as np
import orjson
import pytest
from serving_testkit import REPO_ROOT, SubprocessWorker, free_port, route, state, write_state

from serving.batch_observer import BatchObserver
from serving.logs import JsonFormatter, configure_logging, event

DJANGO_LIKE_LOGGING = {  # the shape of console/settings.py's LOGGING
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "INFO"},
}


def record(message: str, *args, level: int = logging.WARNING, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("serving.control", level, __file__, 1, message, args, exc_info)


def parsed(line: str) -> dict:
    fields = orjson.loads(line)
    assert isinstance(fields, dict)
    return fields


@pytest.fixture
def restored_logging():
    """configure_logging changes process-wide state: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)


def test_a_plain_message_becomes_ts_level_logger_and_message():
    line = parsed(JsonFormatter().format(record("ack of generation %s refused", 7)))

    assert list(line) == ["ts", "level", "logger", "message"]
    assert (line["level"], line["logger"], line["message"]) == ("warning", "serving.control", "ack of generation 7 refused")
    stamp = datetime.fromisoformat(line["ts"])
    assert line["ts"].endswith("Z") and stamp.utcoffset() == timedelta(0)
    assert abs(stamp.timestamp() - time.time()) < 60


def test_a_json_message_is_embedded_as_fields_of_the_same_line():
    line = parsed(JsonFormatter().format(record(event("push_refused", reason="not signed", ts="spoofed", level="spoofed"))))

    assert line["event"] == "push_refused" and line["reason"] == "not signed"
    assert line["level"] == "warning" and line["ts"] != "spoofed"  # a record cannot forge the envelope
    assert "message" not in line


def test_an_exception_is_one_field_of_one_line():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        text = JsonFormatter().format(record("lifespan hook failed", level=logging.ERROR, exc_info=sys.exc_info()))

    assert "\n" not in text
    line = parsed(text)
    assert line["message"] == "lifespan hook failed"
    assert "RuntimeError: boom" in line["exc"]


def test_configure_logging_replaces_a_configuration_made_before_it(restored_logging):
    logging.config.dictConfig(DJANGO_LIKE_LOGGING)
    stream = io.StringIO()

    configure_logging("info", stream)
    logging.getLogger("serving.worker").info("started")
    logging.getLogger("uvicorn.error").info("Uvicorn running")

    lines = [parsed(text) for text in stream.getvalue().splitlines()]
    assert [(line["logger"], line["message"]) for line in lines] == [("serving.worker", "started"), ("uvicorn.error", "Uvicorn running")]
    assert len(logging.getLogger().handlers) == 1


def test_a_batch_is_not_logged_at_info(caplog):
    observer = BatchObserver("m", 1)
    requests = [SimpleNamespace(rows=1, request_id="r1", enqueued_s=0.0)]

    with caplog.at_level(logging.INFO, logger="serving.batcher"):
        observer.on_batch(requests, 0.0, 0.001, 0)

    assert caplog.records == []
    assert observer.counts["batches"] == 1


# ---- the worker processes -------------------------------------------------------------


@pytest.fixture
def state_file(tmp_path, mlp_v1):
    return write_state(tmp_path / "state.json", state(1, {"digits": {"routes": [route(1, 100, *mlp_v1)]}}))


def assert_every_line_is_one_json_object(output: str) -> list[dict]:
    lines = [parsed(text) for text in output.splitlines() if text]
    assert lines, "the worker logged nothing"
    for line in lines:
        assert {"ts", "level", "logger"} <= set(line) and ("message" in line or "event" in line), line
    return lines


def test_python_m_serving_worker_logs_only_json_lines(tmp_path, state_file):
    worker = SubprocessWorker(state_file, tmp_path, SERVING_LOG_LEVEL="info").wait_ready()
    worker.stop()

    lines = assert_every_line_is_one_json_object(worker.process.stderr.read().decode())

    assert any(line["logger"] == "uvicorn.error" for line in lines)
    applied = [line for line in lines if line["logger"] == "serving.repository"]
    assert [(line["event"], line["generation"], line["ok"], "message" in line) for line in applied] == [("state_applied", 1, True, False)]


def test_manage_py_serve_logs_json_lines_although_django_configured_logging_first(tmp_path, state_file):
    port = free_port()
    environment = {**os.environ, "DATA_DIR": str(tmp_path / "data"), "SERVING_DEVICE": "cpu", "SERVING_LOG_LEVEL": "info",
                   "SERVING_CACHE_DIR": str(tmp_path / "cache")}
    worker = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port), "--state-file", str(state_file)],
                              cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and worker.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
    finally:
        worker.terminate()
        output = worker.communicate(timeout=20)[0].decode()

    # Nothing else prints either (django-axes' banner, logged while Django sets up, is off: AXES_VERBOSE).
    lines = assert_every_line_is_one_json_object(output)
    assert any(line["logger"] == "uvicorn.error" and "Uvicorn running" in line["message"] for line in lines)


def gather_model(path) -> tuple:
    """y = table[int(x)]: ONNX Runtime fails the run for an index past the table's 3 rows."""
    import hashlib

    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["index"], to=TensorProto.INT64), helper.make_node("Gather", ["table", "index"], ["y"])],
        "gather",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        initializer=[table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_run_that_onnx_runtime_fails_leaves_no_line_outside_the_json_log(tmp_path):
    model = gather_model(tmp_path / "gather.onnx")
    state_path = write_state(tmp_path / "state.json", state(1, {"gather": {"routes": [route(1, 100, *model)]}}))
    worker = SubprocessWorker(state_path, tmp_path, SERVING_LOG_LEVEL="info").wait_ready()
    try:
        bad = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [7.0]}]}
        answers = [httpx.post(worker.url + "/v2/models/gather/infer", json=bad, timeout=10).status_code for _ in range(3)]
    finally:
        worker.stop()

    assert answers[0] // 100 == 4 and len(set(answers)) == 1, answers  # the client's input, answered as such
    lines = assert_every_line_is_one_json_object(worker.process.stderr.read().decode())
    assert not [line for line in lines if line["level"] == "warning" and "failed" in line.get("message", "")]
