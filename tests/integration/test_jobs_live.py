"""Background jobs end to end, run by real Celery workers: the console under uvicorn, a
Celery worker with beat on the default queue (the job sweep) and one on the jobs queue,
the test's own Redis database and a database of this module's own. Everything goes
through the HTTP API, as a user's script would: uploads end ready or rejected, data sets
give exact scores, batch jobs stream big files, stop on cancel, fail cleanly on a
corrupt file, and a jobs worker killed with SIGKILL (by the PID this test started)
leaves its job retried, then failed, never `running`.
"""

from __future__ import annotations

import io
import os
import signal
import time

import httpx
import numpy as np
import onnxruntime
import pytest
from django.conf import settings

from registry.building.onnx_build import mlp_from_weights, random_mlp, to_bytes
from tests.fixtures.onnx_files import build_unknown_domain
from tools.stack import running_stack, upload_version, wait_until

pytestmark = pytest.mark.integration

FEATURES = 512
BIG_ROWS = 100_000  # 100k rows x 512 float32: a 205 MB input, more than three times a batch job's 64 MiB batch budget
STALE_AFTER_S = 3.0
SWEEP_INTERVAL_S = 1.0
JOB_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def stack(module_database_url, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("jobs-live")
    with running_stack(work_dir, settings, settings.DATABASES["default"], migrate=True, DATABASE_URL=module_database_url,
                       ARTIFACT_ROOT=str(work_dir / "artifacts"), JOB_STALE_AFTER_S=str(STALE_AFTER_S),
                       JOB_SWEEP_INTERVAL_S=str(SWEEP_INTERVAL_S), JOB_HEARTBEAT_S="0.5", JOB_MAX_ATTEMPTS="2",
                       SERVING_INTRA_OP_THREADS="1") as stack:
        stack.start_celery()
        yield stack


@pytest.fixture(scope="module")
def api(stack) -> httpx.Client:
    with httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Token {stack.operator_token()}"}, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def big_input(tmp_path_factory):
    path = tmp_path_factory.mktemp("jobs-input") / "rows.npy"
    np.save(path, np.random.default_rng(7).standard_normal((BIG_ROWS, FEATURES), dtype=np.float32))
    return path


def new_model(api: httpx.Client, name: str) -> None:
    response = api.post("/api/models/", json={"name": name})
    assert response.status_code == 201, response.text


def ready_version(api: httpx.Client, name: str, artifact: bytes) -> dict:
    version = upload_version(api, name, artifact)  # waits for the validation job's verdict
    assert version["status"] == "ready", version
    return version


def job(api: httpx.Client, name: str, job_id: int) -> dict:
    response = api.get(f"/api/models/{name}/jobs/{job_id}/")
    assert response.status_code == 200, response.text
    return response.json()


def finished(api: httpx.Client, name: str, job_id: int, timeout_s: float = JOB_TIMEOUT_S) -> dict:
    answer = wait_until(lambda: (body := job(api, name, job_id))["status"] in {"succeeded", "failed", "cancelled"} and body, timeout_s, 0.1)
    assert answer, job(api, name, job_id)
    return answer


def submit_batch(api: httpx.Client, name: str, path, **fields) -> dict:
    with open(path, "rb") as handle:
        response = api.post(f"/api/models/{name}/jobs/", files={"input": (path.name, handle, "application/octet-stream")},
                            data={key: str(value) for key, value in fields.items()})
    assert response.status_code == 202, response.text
    return response.json()


def running_with_progress(api: httpx.Client, name: str, job_id: int) -> dict:
    answer = wait_until(lambda: (body := job(api, name, job_id))["status"] == "running" and body["done"] > 0 and body, JOB_TIMEOUT_S, 0.05)
    assert answer, job(api, name, job_id)
    return answer


def raw_outputs(artifact: bytes, rows: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(artifact, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"input": rows[start:start + 4096]})[0] for start in range(0, len(rows), 4096)])


def test_an_upload_ends_ready_with_its_benchmark_measured_by_a_real_celery_worker(api):
    new_model(api, "benched")
    version = ready_version(api, "benched", to_bytes(random_mlp([16, 32, 4], seed=1)))

    benchmark = wait_until(lambda: api.get(f"/api/models/benched/versions/{version['number']}/").json()["metrics"].get("benchmark"), JOB_TIMEOUT_S, 0.2)
    assert benchmark, api.get("/api/models/benched/jobs/").json()
    assert [size["batch_size"] for size in benchmark["sizes"]] == [1, 8]  # 1, 8, 32 and the max, up to the max: 8 here
    assert all(size["samples_per_s"] > 0 and size["p99_ms"] >= size["p50_ms"] > 0 for size in benchmark["sizes"])
    assert benchmark["device"] == "cpu" and benchmark["peak_rss_bytes"] > 0


def test_an_upload_that_fails_inspection_ends_rejected_with_its_report(api):
    new_model(api, "refused")
    version = upload_version(api, "refused", to_bytes(build_unknown_domain()))

    assert version["status"] == "rejected"
    assert "domain" in version["status_reason"]
    assert version["validation_report"]["checks"], version["validation_report"]
    assert api.get(f"/api/models/refused/versions/{version['number']}/artifact").status_code == 410


def test_an_evaluation_gives_the_exact_accuracy_on_a_data_set_with_known_answers(api, tmp_path):
    new_model(api, "scored")
    identity = mlp_from_weights([np.eye(4, dtype=np.float32)], [np.zeros(4, np.float32)], output_name="scores", softmax=False)
    version = ready_version(api, "scored", to_bytes(identity))
    classes = np.arange(40) % 4
    labels = np.where(np.arange(40) < 30, classes, (classes + 1) % 4)  # the model is right on exactly 30 of 40
    path = tmp_path / "known.npz"
    np.savez(path, input=np.eye(4, dtype=np.float32)[classes], labels=labels)

    with open(path, "rb") as handle:
        response = api.post("/api/models/scored/datasets/", files={"file": ("known.npz", handle)}, data={"name": "known", "task": "classification"})
    assert response.status_code == 201, response.text

    evaluation = wait_until(lambda: api.get(f"/api/models/scored/versions/{version['number']}/").json()["metrics"].get("evaluation", {}).get("known"),
                            JOB_TIMEOUT_S, 0.2)
    assert evaluation, api.get("/api/models/scored/jobs/").json()
    assert evaluation["accuracy"] == 0.75 and evaluation["samples"] == 40
    expected = np.zeros((4, 4), int)
    np.add.at(expected, (labels, classes), 1)  # rows: the label; columns: the class the model predicts
    assert evaluation["confusion_matrix"] == expected.tolist()


def test_a_batch_job_over_100k_rows_equals_raw_onnxruntime_with_progress_and_bounded_memory(api, big_input, tmp_path):
    new_model(api, "bulk")
    # About 3 s of work on a 2-core CI machine (one hidden layer of 1,024 took 0.5 s, between
    # two of the console's 0.5 s progress writes): progress is seen moving.
    artifact = to_bytes(random_mlp([FEATURES, 2048, 1024, 10], seed=3))
    ready_version(api, "bulk", artifact)

    started = submit_batch(api, "bulk", big_input, batch_size=512)
    seen = set()
    while (body := job(api, "bulk", started["id"]))["status"] in {"queued", "running"}:
        seen.add(body["done"])
        time.sleep(0.05)
    assert body["status"] == "succeeded", body
    assert len({done for done in seen if 0 < done < BIG_ROWS}) >= 2, sorted(seen)  # progress reported more than once
    assert body["result"]["rows"] == BIG_ROWS and body["result"]["errors"] == 0
    small = tmp_path / "small.npy"
    np.save(small, np.load(big_input, mmap_mode="r")[:2048])
    baseline = finished(api, "bulk", submit_batch(api, "bulk", small, batch_size=512)["id"])
    assert baseline["status"] == "succeeded", baseline
    # Memory is bounded by a batch, not the file: 49 times the rows (a 205 MB file) add
    # less than a quarter of the file to the peak (a job holding the file would add all of it).
    grown = body["result"]["peak_rss_bytes"] - baseline["result"]["peak_rss_bytes"]
    assert grown < 0.25 * big_input.stat().st_size, (body["result"], baseline["result"])

    output = api.get(f"/api/models/bulk/jobs/{started['id']}/output")
    assert output.status_code == 200
    served = np.load(io.BytesIO(output.content))
    np.testing.assert_allclose(served, raw_outputs(artifact, np.load(big_input)), rtol=1e-5, atol=1e-6)


def slow_model_version(api: httpx.Client, name: str) -> None:
    new_model(api, name)
    ready_version(api, name, to_bytes(random_mlp([FEATURES, 1024, 1024, 10], seed=4)))


def test_a_cancelled_batch_job_stops_within_a_second(api, big_input):
    slow_model_version(api, "cancelled")
    started = submit_batch(api, "cancelled", big_input, batch_size=1)  # one row a call: minutes of work
    running_with_progress(api, "cancelled", started["id"])

    asked_at = time.monotonic()
    assert api.post(f"/api/models/cancelled/jobs/{started['id']}/cancel/").status_code == 202
    stopped = wait_until(lambda: (body := job(api, "cancelled", started["id"]))["status"] == "cancelled" and body, 10, 0.05)
    took_s = time.monotonic() - asked_at

    assert stopped, job(api, "cancelled", started["id"])
    assert took_s < 2.0, took_s  # the runner polls every 0.25 s and ends the child with SIGTERM; 2 s for two busy cores
    assert stopped["done"] < BIG_ROWS and not stopped["output_available"]
    assert api.get(f"/api/models/cancelled/jobs/{started['id']}/output").status_code == 409


def test_a_corrupt_file_fails_the_job_with_its_reason(api, tmp_path):
    new_model(api, "corrupt")
    ready_version(api, "corrupt", to_bytes(random_mlp([16, 4], seed=5)))
    path = tmp_path / "damaged.npz"
    np.savez_compressed(path, input=np.random.default_rng(0).standard_normal((20_000, 16), dtype=np.float32))
    damaged = bytearray(path.read_bytes())
    middle = len(damaged) // 2
    damaged[middle:middle + 64] = bytes(byte ^ 0xFF for byte in damaged[middle:middle + 64])  # the zip's directory stays intact
    path.write_bytes(bytes(damaged))

    started = submit_batch(api, "corrupt", path)
    ended = finished(api, "corrupt", started["id"])

    assert ended["status"] == "failed"
    assert "input" in ended["error"] and "Celery worker's log" not in ended["error"], ended["error"]
    assert not ended["output_available"]


def kill_job_worker(stack) -> None:
    """SIGKILL to the jobs worker's process group: the PID this test started, its pool
    process and the job's child (which also dies with its parent: setpriv --pdeathsig)."""
    os.killpg(stack.jobs.popen.pid, signal.SIGKILL)
    stack.jobs.popen.wait(timeout=10)


def test_a_job_whose_celery_worker_is_killed_is_retried_then_failed_never_left_running(api, stack, big_input):
    slow_model_version(api, "killed")
    started = submit_batch(api, "killed", big_input, batch_size=1)

    running_with_progress(api, "killed", started["id"])
    kill_job_worker(stack)
    stack.start_job_worker(purge=False)
    retried = wait_until(lambda: (body := job(api, "killed", started["id"]))["attempts"] == 2 and body["status"] == "running" and body,
                         STALE_AFTER_S + SWEEP_INTERVAL_S + 30, 0.1)
    assert retried, job(api, "killed", started["id"])  # swept as stale, queued again, taken by the new worker

    running_with_progress(api, "killed", started["id"])
    kill_job_worker(stack)
    ended = wait_until(lambda: (body := job(api, "killed", started["id"]))["status"] != "running" and body, STALE_AFTER_S + SWEEP_INTERVAL_S + 10, 0.1)
    stack.start_job_worker(purge=False)  # the stack's other tests keep a jobs worker

    assert ended and ended["status"] == "failed", ended
    assert "Celery worker stopped" in ended["error"] and "2 attempts" in ended["error"]
