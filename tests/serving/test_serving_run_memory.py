"""The memory a worker's runs take is capped (SERVING_RUN_MEMORY_MB) and given back
(serving/run_memory.py). The model here allocates as much as its input names (4 KiB a
row), as one an audit used to take a worker from 181 MB to 2.58 GB with a 40-byte
request: each worker below is its own process, as deployed, and its memory is read from
/proc by PID."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from serving_testkit import SubprocessWorker, route, state, write_model, write_state

from bench.run_memory_bench import allocates_as_named
from serving import run_memory

MIB = 1024 * 1024


def worker_with_cap(tmp_path, cap_mb: int) -> SubprocessWorker:
    path, sha256 = write_model(tmp_path, "allocates", allocates_as_named())
    state_file = write_state(tmp_path / "state.json", state(1, {"allocates": {"routes": [route(1, 100, path, sha256, batchable=False)]}}))
    return SubprocessWorker(state_file, tmp_path, SERVING_RUN_MEMORY_MB=str(cap_mb)).wait_ready()


def ask(worker: SubprocessWorker, kib_4: int) -> httpx.Response:
    body = {"inputs": [{"name": "n", "datatype": "INT64", "shape": [1], "data": [kib_4]}]}
    return httpx.post(f"{worker.url}/v2/models/allocates/infer", json=body, timeout=30)


def memory_mb(worker: SubprocessWorker, field: str) -> float:
    """VmRSS (now) or VmHWM (the most it ever held), from the kernel."""
    for line in open(f"/proc/{worker.process.pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for the worker")


@pytest.fixture
def capped_at_64_mb(tmp_path):
    worker = worker_with_cap(tmp_path, 64)
    yield worker
    worker.stop()


def test_a_request_needing_more_than_the_cap_is_a_413_naming_it_and_the_worker_never_holds_it(capped_at_64_mb):
    before_mb = memory_mb(capped_at_64_mb, "VmRSS")

    answer = ask(capped_at_64_mb, 500_000)  # 1.9 GiB in one tensor

    assert answer.status_code == 413
    assert "SERVING_RUN_MEMORY_MB" in answer.json()["error"] and "64 MiB" in answer.json()["error"]
    assert memory_mb(capped_at_64_mb, "VmHWM") - before_mb < 100


def test_the_worker_answers_within_the_cap_after_refusing(capped_at_64_mb):
    assert ask(capped_at_64_mb, 500_000).status_code == 413

    answer = ask(capped_at_64_mb, 2_000)  # 8 MiB

    assert answer.status_code == 200
    assert answer.json()["outputs"][0]["data"] == [2_000 * 1024.0]


def test_a_large_run_within_the_cap_gives_its_memory_back(tmp_path):
    worker = worker_with_cap(tmp_path, 1024)
    try:
        before_mb = memory_mb(worker, "VmRSS")
        assert ask(worker, 100_000).status_code == 200  # 391 MiB
        time.sleep(run_memory.SHRINK_EVERY_S + 0.1)

        assert ask(worker, 10).status_code == 200  # the next batch after a second gives the arena back
        assert memory_mb(worker, "VmHWM") - before_mb > 300  # it did hold it
        assert memory_mb(worker, "VmRSS") - before_mb < 100
    finally:
        worker.stop()


def ort_arena_error(available: int, requested: int) -> Exception:
    return RuntimeError(f"[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running ConstantOfShape node. "
                        f"Status Message: bfc_arena.cc:360 Available memory of {available} is smaller than requested bytes of {requested}")


def test_a_request_that_fits_the_cap_but_not_what_others_left_is_a_503_to_retry():
    refusal = run_memory.refusal(ort_arena_error(10 * MIB, 40 * MIB), limit=64 * MIB)

    assert refusal.status == 503 and (b"retry-after", b"1") in refusal.headers
    assert "in use by other requests" in refusal.message


def test_any_other_failure_is_not_a_memory_refusal():
    assert run_memory.refusal(RuntimeError("Non-zero status code returned while running Gather node"), limit=64 * MIB) is None


def test_the_default_cap_is_half_the_memory_the_process_may_use():
    assert run_memory.limit_bytes(0) == int(run_memory.available_bytes() * 0.5)
    assert run_memory.limit_bytes(256) == 256 * MIB


def test_the_worker_logs_its_cap_as_one_json_line_with_the_event_and_the_limit(tmp_path):
    path, sha256 = write_model(tmp_path, "allocates", allocates_as_named())
    state_file = write_state(tmp_path / "state.json", state(1, {"allocates": {"routes": [route(1, 100, path, sha256, batchable=False)]}}))
    worker = SubprocessWorker(state_file, tmp_path, SERVING_RUN_MEMORY_MB="64", SERVING_LOG_LEVEL="info").wait_ready()
    worker.stop()

    lines = [json.loads(line) for line in worker.process.stderr.read().decode().splitlines() if line.startswith("{")]

    [capped] = [line for line in lines if line.get("event") == "run_memory_capped"]
    assert (capped["level"], capped["limit_mb"]) == ("info", 64)
