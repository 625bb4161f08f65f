"""Batch-job throughput against raw ONNX Runtime, on the same model and batch size, in one run.

    .venv/bin/python -m bench.batch_job_bench [--rows 200000] [--repeats 2] [--batch-sizes 256,1024]

For each model and batch size, alternating so the box's noise hits both alike:
- raw: ONNX Runtime's `run` over in-memory arrays, the session built as a worker builds
  it (`serving.engine.Engine`, `ServingConfig.from_env()`), no file, no copy;
- job: `python -m serving.jobs batch` on an `.npy` file of the same rows, as the Celery
  worker runs a batch job (`registry/jobs/child.py` starts exactly this command): file
  read in chunks, outputs written to an `.npy`. "job rows/s" is rows over the child's
  whole life (start, model load, reading, running, writing); "steady rows/s" is measured
  between its first and last progress events.
Target (issue 12): job rows/s ≥ 80 % of raw samples/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from registry.building.onnx_build import random_mlp, to_bytes
from serving.config import ServingConfig
from serving.engine import Engine, resolve_device

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"small": [64, 128, 10], "mid": [512, 1024, 1024, 100]}
TARGET = 0.80


def raw_rows_per_s(model_bytes: bytes, rows: np.ndarray, batch_size: int) -> float:
    config = ServingConfig.from_env()
    engine = Engine(model_bytes, config, resolve_device(config))
    engine.run((rows[:batch_size],))  # warm the shape
    started = time.perf_counter()
    for start in range(0, len(rows), batch_size):
        engine.run((rows[start:start + batch_size],))
    return len(rows) / (time.perf_counter() - started)


def job_rows_per_s(model_path: Path, input_path: Path, output_path: Path, batch_size: int, rows: int) -> tuple[float, float]:
    command = [sys.executable, "-m", "serving.jobs", "batch", "--model", str(model_path), "--input", str(input_path),
               "--format", "npy", "--output", str(output_path), "--batch-size", str(batch_size)]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    progress: list[tuple[float, int]] = []
    result = None
    for line in process.stdout:
        event = json.loads(line)
        if event["event"] == "progress":
            progress.append((time.perf_counter(), event["done"]))
        elif event["event"] == "result":
            result = event["result"]
    process.wait()
    whole_s = time.perf_counter() - started
    if process.returncode != 0 or result is None or result["rows"] != rows:
        raise SystemExit(f"the batch job failed: exit {process.returncode}, result {result}")
    (first_s, first_done), (last_s, last_done) = progress[0], progress[-1]
    steady = (last_done - first_done) / (last_s - first_s) if last_s > first_s else float("nan")
    return rows / whole_s, steady


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch-sizes", default="256,1024")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    sizes = [int(size) for size in args.batch_sizes.split(",")]
    print(f"{'model':<6} {'batch':>5} {'raw rows/s':>11} {'job rows/s':>11} {'steady rows/s':>13} {'job/raw':>8} {'steady/raw':>10} {'target':>7}")
    with tempfile.TemporaryDirectory(prefix="batch-bench-") as work:
        work_dir = Path(work)
        for name in args.models.split(","):
            layers = MODELS[name]
            model_bytes = to_bytes(random_mlp(layers, seed=0))
            model_path = work_dir / f"{name}.onnx"
            model_path.write_bytes(model_bytes)
            rows = np.random.default_rng(0).standard_normal((args.rows, layers[0]), dtype=np.float32)
            input_path = work_dir / f"{name}.npy"
            np.save(input_path, rows)
            for batch_size in sizes:
                raws, jobs, steadies = [], [], []
                for _ in range(args.repeats):
                    raws.append(raw_rows_per_s(model_bytes, rows, batch_size))
                    whole, steady = job_rows_per_s(model_path, input_path, work_dir / "out.npy", batch_size, args.rows)
                    jobs.append(whole)
                    steadies.append(steady)
                raw, job, steady = statistics.median(raws), statistics.median(jobs), statistics.median(steadies)
                verdict = "met" if job / raw >= TARGET else "MISSED"
                print(f"{name:<6} {batch_size:>5} {raw:>11,.0f} {job:>11,.0f} {steady:>13,.0f} {job / raw:>7.0%} {steady / raw:>9.0%} {verdict:>7}")


if __name__ == "__main__":
    main()
