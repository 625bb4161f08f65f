"""The benchmark command: throughput and latency of a model at a few batch sizes.

Each size is warmed first (the first run of a shape pays for kernels and memory
patterns), then timed for --seconds-per-size and at least MIN_TIMED_RUNS runs, so p99
means something even for a slow model. Inputs are zeros (`Engine.example_inputs`):
timing, not answers. The session is built exactly as a worker builds it, so the
numbers are the ones the worker's own SERVING_* options give.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from serving.config import ServingConfig
from serving.engine import Engine
from serving.jobs.formats import FormatError
from serving.jobs.model import describe_failure, load_engine
from serving.jobs.protocol import Progress, peak_rss_bytes
from serving.run_stop import stopped_after

STANDARD_SIZES = (1, 8, 32)
WARM_RUNS = 3
MIN_TIMED_RUNS = 20
# A model so slow that MIN_TIMED_RUNS would take this many times the time asked stops early.
MAX_OVERRUN_FACTOR = 10


def batch_sizes(max_batch_size: int, batchable: bool) -> list[int]:
    if not batchable:
        return [1]
    return sorted({size for size in (*STANDARD_SIZES, max_batch_size) if size <= max_batch_size})


def run(model: Path | bytes, max_batch_size: int, seconds_per_size: float) -> dict:
    config = ServingConfig.from_env()
    engine = load_engine(model, config)
    sizes = batch_sizes(max_batch_size, engine.is_batchable)
    progress = Progress(len(sizes))
    measured = []
    for done, size in enumerate(sizes, start=1):
        measured.append(measure(engine, size, seconds_per_size, config.warm_timeout_s))
        progress.tick(done)
    progress.finish(len(sizes))
    return {"device": engine.device, "onnxruntime": ort.__version__, "sizes": measured,
            "peak_rss_bytes": peak_rss_bytes(), "session": session_summary(engine, config)}


def measure(engine: Engine, batch_size: int, seconds: float, warm_timeout_s: float | None = None) -> dict:
    """The size's figures. Its warm runs are stopped past ``warm_timeout_s`` (the worker's
    SERVING_WARM_TIMEOUT_S): a model looping for ever at 8 rows held the one jobs worker,
    every upload's validation queued behind it, until JOB_TIMEOUT_S (an hour)."""
    feeds = engine.example_inputs(batch_size)
    try:
        with stopped_after(warm_timeout_s) as stop:
            warm = stop.running(engine.run)
            for _ in range(WARM_RUNS):
                warm(feeds)
        timings_s = _timed_runs(engine, feeds, seconds)
    except Exception as error:  # noqa: BLE001 - ORT raises its own classes, with no common base
        if stop.stopped:
            raise FormatError(f"the model did not finish a batch of {batch_size} rows of zeros within SERVING_WARM_TIMEOUT_S "
                              f"({warm_timeout_s:g} s); its run was stopped") from None
        raise FormatError(f"the model fails on a batch of {batch_size} rows of zeros: "
                          f"{describe_failure(error)}") from None
    timings = np.asarray(timings_s)
    return {"batch_size": batch_size, "runs": len(timings),
            "samples_per_s": batch_size * len(timings) / float(timings.sum()),
            "p50_ms": float(np.percentile(timings, 50)) * 1000, "p99_ms": float(np.percentile(timings, 99)) * 1000}


def _timed_runs(engine: Engine, feeds: tuple, seconds: float) -> list[float]:
    timings_s: list[float] = []
    started_s = time.perf_counter()
    while True:
        run_started_s = time.perf_counter()
        engine.run(feeds)
        now_s = time.perf_counter()
        timings_s.append(now_s - run_started_s)
        elapsed_s = now_s - started_s
        if elapsed_s >= seconds and (len(timings_s) >= MIN_TIMED_RUNS or elapsed_s >= MAX_OVERRUN_FACTOR * seconds):
            return timings_s


def session_summary(engine: Engine, config: ServingConfig) -> dict:
    """The options the session ran with (the worker's SERVING_* settings)."""
    summary = {
        "providers": engine.session.get_providers(),
        "intra_op_threads": config.intra_op_threads,
        "inter_op_threads": config.inter_op_threads,
        "graph_optimization": config.graph_optimization,
        "execution_mode": config.execution_mode,
        "memory_pattern": config.memory_pattern,
        "allow_spinning": config.allow_spinning,
    }
    if engine.device.startswith("cuda:"):
        summary.update(cuda_device_id=config.cuda_device_id, cudnn_conv_algo_search=config.cudnn_conv_algo_search,
                       gpu_mem_limit_bytes=config.gpu_mem_limit_bytes)
    return summary
