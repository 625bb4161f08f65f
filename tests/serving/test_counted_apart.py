"""What a version's report figures hold, through a real worker: the traffic the split sent it.

The console's charts and the canary analysis judge a version by these figures, and a
drill by the worker's failure total. A client that names the version (pinned) or sets
itself a deadline it cannot meet must not move them: those requests are answered as
before and counted apart on /metrics (`modelops_pinned_requests_total`,
`modelops_client_deadline_refusals_total`), and a pinned request's outputs stay out of
the version's output summary, even when they ran in one batch with routed requests. A 504
under the worker's own deadline (SERVING_REQUEST_TIMEOUT_S) stays a failure."""

from __future__ import annotations

import asyncio
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving_testkit import HeldRun, route, state, v2_body, wait_until

from serving.contract import WorkerIdentity
from serving.reports import ReportBuilder

ONE_ROW = np.ones((1, 64), np.float32)


def version_entry(worker, builder: ReportBuilder, model: str, version: int) -> dict:
    """One version's entry in a report built on the worker's loop."""

    async def build():
        return builder.build(WorkerIdentity("w-counted-apart"), worker.worker.repository)

    built = asyncio.run_coroutine_threadsafe(build(), worker.loop).result(timeout=10)
    return next(entry for entry in built.versions if (entry["model"], entry["version"]) == (model, version))


def version_figures(worker, builder: ReportBuilder, model: str, version: int) -> tuple[int, int, int, int]:
    """(requests, ok, errors, client_errors) of one version in a report."""
    entry = version_entry(worker, builder, model, version)
    return entry["requests"], entry["ok"], entry["errors"], entry["client_errors"]


def summarised_rows(entry: dict) -> int:
    """The rows in a report entry's output summary (the classifier's top-class counts)."""
    return sum(sum(output["counts"]) for output in entry["outputs"])


def series(client, worker, name: str, **labels) -> float:
    """One sample of the worker's /metrics, 0 when the series does not exist."""
    text = client.get(worker.url + "/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def failed_total(client, worker) -> int:
    return client.get(worker.url + "/health").json()["requests_failed_total"]


PINNED = {
    "v2-ok": ("/v2/models/{model}/versions/2/infer", lambda model: v2_body(ONE_ROW), 200),
    "predict-ok": ("/predict", lambda model: {"model_name": model, "version": 2, "inputs": ONE_ROW[0].tolist()}, 200),
    "v2-malformed": ("/v2/models/{model}/versions/2/infer", lambda model: {}, 400),
    "predict-malformed": ("/predict", lambda model: {"model_name": model, "version": 2, "inputs": "nope"}, 400),
}


@pytest.mark.parametrize("kind", PINNED)
def test_pinned_requests_are_on_metrics_and_not_in_the_versions_report_figures(start_worker, client, mlp_v1, kind):
    model = f"pinned-{kind}"
    worker = start_worker(state(1, {model: {"routes": [route(1, 50, *mlp_v1), route(2, 50, *mlp_v1)]}}))
    builder = ReportBuilder()
    version_figures(worker, builder, model, 2)  # the warm-up and anything before are behind this one
    path, body, status = PINNED[kind]

    answers = [client.post(worker.url + path.format(model=model), json=body(model)) for _ in range(3)]

    assert [(answer.status_code, answer.headers["x-model-version"]) for answer in answers] == [(status, "2")] * 3
    assert version_figures(worker, builder, model, 2) == (0, 0, 0, 0)
    assert series(client, worker, "modelops_pinned_requests_total", model=model, version="2", code=str(status)) == 3


def test_pinned_requests_outputs_stay_out_of_the_output_summary_even_in_a_batch_with_routed_ones(start_worker, client, mlp_v1):
    model = "pinned-outputs"
    worker = start_worker(state(1, {model: {"routes": [route(1, 100, *mlp_v1)]}}), max_batches_in_flight=1)
    builder = ReportBuilder()
    version_entry(worker, builder, model, 1)
    version = worker.worker.repository.loaded[(model, 1)]
    held = version.engine.run = HeldRun(version.engine.run)  # the first batch holds the engine while the rest queue
    routed, pinned = f"{worker.url}/v2/models/{model}/infer", f"{worker.url}/v2/models/{model}/versions/1/infer"
    queued = [(pinned, np.ones((3, 64), np.float32)), (routed, ONE_ROW), (pinned, ONE_ROW)]
    with ThreadPoolExecutor(len(queued) + 1) as pool:
        try:
            first = pool.submit(client.post, routed, json=v2_body(ONE_ROW))
            assert held.entered.wait(5)
            later = [pool.submit(client.post, url, json=v2_body(rows)) for url, rows in queued]
            give_up_s = time.monotonic() + 5
            while version.queue_depth < len(queued) and time.monotonic() < give_up_s:
                time.sleep(0.01)
        finally:
            held.release.set()
        answers = [future.result(timeout=10) for future in (first, *later)]

    assert [answer.status_code for answer in answers] == [200] * 4
    assert held.rows == [1, 5]  # the second batch: one routed row, four pinned ones
    assert summarised_rows(version_entry(worker, builder, model, 1)) == 2


CLIENT_DEADLINES = {
    "header": ({"X-Request-Timeout-S": "0.000001"}, v2_body(ONE_ROW)),
    "parameters.timeout": ({}, {**v2_body(ONE_ROW), "parameters": {"timeout": 1}}),  # microseconds
}


@pytest.mark.parametrize("given_in", CLIENT_DEADLINES)
def test_a_504_under_the_clients_own_shorter_deadline_is_counted_apart_and_is_no_failure(start_worker, client, mlp_v1, given_in):
    model = f"deadline-{given_in}"
    worker = start_worker(state(1, {model: {"routes": [route(1, 100, *mlp_v1)]}}))
    assert client.post(f"{worker.url}/v2/models/{model}/infer", json=v2_body(ONE_ROW)).status_code == 200  # latency now known
    builder = ReportBuilder()
    version_figures(worker, builder, model, 1)
    failed_before = failed_total(client, worker)
    headers, body = CLIENT_DEADLINES[given_in]

    answers = [client.post(f"{worker.url}/v2/models/{model}/infer", json=body, headers=headers) for _ in range(4)]

    assert [answer.status_code for answer in answers] == [504] * 4
    assert all("deadline" in answer.json()["error"] for answer in answers)
    assert version_figures(worker, builder, model, 1) == (0, 0, 0, 0)
    assert failed_total(client, worker) == failed_before
    assert series(client, worker, "modelops_client_deadline_refusals_total", model=model, version="1") == 4


def test_a_504_under_the_workers_own_deadline_is_still_a_failure_of_the_version(start_worker, client, mlp_v1):
    """The client's header asks for more time than SERVING_REQUEST_TIMEOUT_S: only shorter counts."""
    model = "deadline-server"
    worker = start_worker(state(1, {model: {"routes": [route(1, 100, *mlp_v1)]}}), request_timeout_s=0.3)
    builder = ReportBuilder()
    version_figures(worker, builder, model, 1)
    failed_before = failed_total(client, worker)
    version = worker.worker.repository.loaded[(model, 1)]
    held = version.engine.run = HeldRun(version.engine.run)  # the model is still running at the deadline
    try:
        answer = client.post(f"{worker.url}/v2/models/{model}/infer", json=v2_body(ONE_ROW), headers={"X-Request-Timeout-S": "30"})
    finally:
        held.release.set()

    assert answer.status_code == 504
    assert version_figures(worker, builder, model, 1) == (1, 0, 1, 0)
    assert failed_total(client, worker) == failed_before + 1
    assert series(client, worker, "modelops_client_deadline_refusals_total", model=model, version="1") == 0


# ---- a body sent slowly: the client's time, not the worker's -------------------------------


def send_slowly(worker, path: str, body: bytes, pause_s: float, headers: str = "") -> bytes:
    """Headers and the body's first 10 bytes, a pause, then the rest; the raw answer."""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n{headers}\r\n").encode()
    with socket.create_connection(("127.0.0.1", worker.port), timeout=10) as connection:
        connection.sendall(head + body[:10])
        time.sleep(pause_s)
        try:
            connection.sendall(body[10:])
        except OSError:  # refused meanwhile: read what it answered
            pass
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


SLOW_BODIES = {
    "v2": lambda model: (f"/v2/models/{model}/infer", orjson.dumps(v2_body(ONE_ROW))),
    "predict": lambda model: ("/predict", orjson.dumps({"model_name": model, "inputs": ONE_ROW[0].tolist()})),
}


@pytest.mark.parametrize("endpoint", SLOW_BODIES)
def test_a_body_sent_slower_than_the_request_timeout_is_served_and_is_no_failure(start_worker, client, mlp_v1, endpoint):
    """SERVING_REQUEST_TIMEOUT_S starts when the body is whole: counted from the headers, a
    body sent slowly was a 504 counted against the version, which failed canaries and drills."""
    model = f"slow-body-{endpoint}"
    worker = start_worker(state(1, {model: {"routes": [route(1, 100, *mlp_v1)]}}), request_timeout_s=0.5, body_timeout_s=10.0)
    failed_before = failed_total(client, worker)
    path, body = SLOW_BODIES[endpoint](model)

    answer = send_slowly(worker, path, body, pause_s=1.5)

    assert answer.startswith(b"HTTP/1.1 200 ")
    assert failed_total(client, worker) == failed_before
    assert series(client, worker, "modelops_requests_total", model=model, version="1", code="200") == 1
    assert series(client, worker, "modelops_requests_total", model=model, version="1", code="504") == 0
    assert series(client, worker, "modelops_request_duration_seconds_sum", model=model, version="1") < 1.0  # the 1.5 s pause is the client's


def test_a_body_slower_than_the_body_timeout_is_still_refused_408(start_worker, client, mlp_v1):
    model = "slow-body-408"
    worker = start_worker(state(1, {model: {"routes": [route(1, 100, *mlp_v1)]}}), request_timeout_s=0.3, body_timeout_s=0.8)
    path, body = SLOW_BODIES["v2"](model)

    answer = send_slowly(worker, path, body, pause_s=2.0)

    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"request body did not arrive within 0.8 s" in answer
    # and the time the body never took is no latency of the version's: 20 s bodies of an
    # anonymous client filled the +Inf bucket a canary's p99 is read from
    assert wait_until(lambda: series(client, worker, "modelops_request_duration_seconds_count", model=model, version="1") == 1)
    assert series(client, worker, "modelops_request_duration_seconds_sum", model=model, version="1") < 0.5


def test_a_clients_own_deadline_still_counts_from_its_headers(start_worker, client, mlp_v1):
    """X-Request-Timeout-S keeps its meaning: the time since the request began to arrive.
    Missed, it is the client's 504, counted apart."""
    model = "slow-body-client-deadline"
    worker = start_worker(state(1, {model: {"routes": [route(1, 100, *mlp_v1)]}}), request_timeout_s=5.0, body_timeout_s=10.0)
    failed_before = failed_total(client, worker)
    path, body = SLOW_BODIES["v2"](model)

    answer = send_slowly(worker, path, body, pause_s=1.0, headers="X-Request-Timeout-S: 0.5\r\n")

    assert answer.startswith(b"HTTP/1.1 504 ")
    assert failed_total(client, worker) == failed_before
    assert series(client, worker, "modelops_client_deadline_refusals_total", model=model, version="1") == 1
