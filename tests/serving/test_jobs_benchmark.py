"""`python -m serving.jobs benchmark`: throughput and latency at a few batch sizes."""

from __future__ import annotations

import onnxruntime as ort
import pytest
from jobs_testkit import captured_events, fixed_single_row, run_job_cli, write_model

from registry.building.onnx_build import random_mlp
from serving.jobs import benchmark
from serving.jobs.benchmark import MIN_TIMED_RUNS, batch_sizes
from serving.jobs.protocol import run_job


def test_a_benchmark_reports_sizes_1_8_32_and_the_max_with_sane_numbers(tmp_path):
    model = write_model(tmp_path / "mlp.onnx", random_mlp([16, 32, 4], seed=2))
    job = run_job_cli("benchmark", "--model", model, "--max-batch-size", 50, "--seconds-per-size", 0.05)
    assert job.returncode == 0
    result = job.result
    assert [size["batch_size"] for size in result["sizes"]] == [1, 8, 32, 50]
    for size in result["sizes"]:
        assert size["runs"] >= MIN_TIMED_RUNS
        assert 0 < size["p50_ms"] <= size["p99_ms"]
        assert size["samples_per_s"] > 0
    assert (result["device"], result["onnxruntime"]) == ("cpu", ort.__version__)
    assert result["session"]["providers"] == ["CPUExecutionProvider"]
    assert result["session"]["intra_op_threads"] == 1  # the child's SERVING_INTRA_OP_THREADS
    assert result["peak_rss_bytes"] > 0
    assert job.progress[-1] == {"event": "progress", "done": 4, "total": 4}


@pytest.mark.parametrize(("max_batch_size", "batchable", "sizes"), [
    (64, True, [1, 8, 32, 64]), (32, True, [1, 8, 32]), (4, True, [1, 4]), (1, True, [1]), (64, False, [1]),
])
def test_batch_sizes_are_the_standard_ones_up_to_the_max(max_batch_size, batchable, sizes):
    assert batch_sizes(max_batch_size, batchable) == sizes


def test_a_model_that_is_not_batchable_is_timed_at_batch_size_1_only(tmp_path, capsys):
    model = write_model(tmp_path / "fixed.onnx", fixed_single_row(3))
    code = run_job(lambda: benchmark.run(model, 64, 0.01))
    events = captured_events(capsys.readouterr().out)
    assert code == 0
    assert [size["batch_size"] for size in events[-1]["result"]["sizes"]] == [1]


def test_a_size_whose_warm_runs_never_end_is_stopped_past_the_warm_timeout_naming_it(tmp_path):
    # A model looping for ever at 8 rows held the one jobs worker for JOB_TIMEOUT_S (an hour).
    from serving_testkit import loops_for_ever_at, make_config, to_bytes

    from serving.engine import Engine
    from serving.jobs.benchmark import measure
    from serving.jobs.formats import FormatError

    engine = Engine(to_bytes(loops_for_ever_at(8)), make_config(tmp_path), "cpu")

    with pytest.raises(FormatError, match=r"did not finish a batch of 8 rows of zeros within SERVING_WARM_TIMEOUT_S \(0.5 s\)"):
        measure(engine, 8, 0.1, warm_timeout_s=0.5)
    assert measure(engine, 4, 0.05, warm_timeout_s=0.5)["batch_size"] == 4
