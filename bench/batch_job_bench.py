"""Batch-job throughput against raw ONNX Runtime, on the same model and batch size, in one run.

    .venv/bin/python -m bench.batch_job_bench [--raw-seconds 2] [--max-file-mib 1024] [--repeats 3]
        [--batch-sizes 256,1024] [--models small,mid] [--text-rows 20000] [--rows N]

For each model and batch size, alternating so the box's noise hits both alike, medians of
`--repeats` runs of each:
- raw: ONNX Runtime's `run` over in-memory arrays, the session built as a worker builds
  it (`serving.engine.Engine`, `ServingConfig.from_env()`), no file, no copy;
- job: `python -m serving.jobs batch` on an `.npy` file of the same rows, as the Celery
  worker runs a batch job (`registry/jobs/child.py` starts exactly this command): file
  read in chunks, outputs written to an `.npy`.

Rows: per model, enough for raw ONNX Runtime to take `--raw-seconds` at the largest batch
size (estimated from a short raw run), capped so that the `.npy` input stays within
`--max-file-mib`; `--rows` fixes them instead.

Two job figures:
- "whole rows/s": rows over the child's whole life: interpreter start, numpy and ONNX
  Runtime imports, session creation, then the file. "start s" is that life up to the
  first progress event, i.e. the fixed cost plus one batch;
- "steady rows/s": rows between the first and the last progress event over the time
  between them: reading, running and writing, outputs renamed into place included.

Target (issue 12): batch-job rows/s ≥ 80 % of raw samples/s, judged on **steady/raw**.
Why: the target is about the job's streaming path (reading, converting, running, writing),
which scales with the file. Starting the child costs a fixed ~0.3-0.5 s per job whatever
its size (most of it importing ONNX Runtime and building the session, which raw pays
before its clock starts too); a real batch job runs for minutes and amortises it, while a
file that raw ONNX Runtime runs in a second cannot. whole/raw is printed beside it to
show how much of a job of this size that fixed cost takes.

`--formats` adds `.jsonl` and `.csv` inputs of `--text-rows` rows per model (the first
batch size only), for information: they parse text per row, and have no target.
"""

from __future__ import annotations

import argparse
import csv
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
PROBE_BATCHES = 20


def engine_for(model_bytes: bytes) -> Engine:
    config = ServingConfig.from_env()
    return Engine(model_bytes, config, resolve_device(config))


def raw_rows_per_s(engine: Engine, rows: np.ndarray, batch_size: int) -> float:
    engine.run((rows[:batch_size],))  # warm the shape
    started = time.perf_counter()
    for start in range(0, len(rows), batch_size):
        engine.run((rows[start:start + batch_size],))
    return len(rows) / (time.perf_counter() - started)


def rows_for(model_bytes: bytes, width: int, batch_size: int, raw_seconds: float, max_file_bytes: int) -> int:
    """Rows that raw ONNX Runtime runs in about `raw_seconds`, within the file-size cap."""
    probe = np.random.default_rng(1).standard_normal((PROBE_BATCHES * batch_size, width), dtype=np.float32)
    rate = max(raw_rows_per_s(engine_for(model_bytes), probe, batch_size) for _ in range(2))
    return max(batch_size, min(int(rate * raw_seconds), max_file_bytes // (width * 4)))


def job_rows_per_s(model_path: Path, input_path: Path, file_format: str, output_path: Path, batch_size: int,
                   rows: int) -> tuple[float, float, float]:
    """(whole-life rows/s, steady rows/s, seconds to the first progress event) of one batch job."""
    command = [sys.executable, "-m", "serving.jobs", "batch", "--model", str(model_path), "--input", str(input_path),
               "--format", file_format, "--output", str(output_path), "--batch-size", str(batch_size)]
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
    if process.returncode != 0 or result is None or result["rows"] != rows or result["errors"]:
        raise SystemExit(f"the batch job failed: exit {process.returncode}, result {result}")
    # A job writes a new file; replacing the last run's would charge its deletion to this one.
    output_path.unlink()
    (first_s, first_done), (last_s, last_done) = progress[0], progress[-1]
    steady = (last_done - first_done) / (last_s - first_s) if last_s > first_s else float("nan")
    return rows / whole_s, steady, first_s - started


def write_text(path: Path, rows: np.ndarray, file_format: str) -> None:
    with open(path, "w", newline="") as fp:
        if file_format == "jsonl":
            fp.writelines(json.dumps(row) + "\n" for row in rows.tolist())
        else:
            csv.writer(fp).writerows(rows.tolist())


def compare(name: str, model_bytes: bytes, model_path: Path, input_path: Path, file_format: str, rows: np.ndarray,
            batch_size: int, repeats: int, out_dir: Path) -> str:
    raws, wholes, steadies, starts = [], [], [], []
    engine = engine_for(model_bytes)
    for _ in range(repeats):
        raws.append(raw_rows_per_s(engine, rows, batch_size))
        whole, steady, start_s = job_rows_per_s(model_path, input_path, file_format, out_dir / f"out.{file_format}",
                                                batch_size, len(rows))
        wholes.append(whole)
        steadies.append(steady)
        starts.append(start_s)
    raw, whole, steady, start_s = (statistics.median(values) for values in (raws, wholes, steadies, starts))
    verdict = ("met" if steady / raw >= TARGET else "MISSED") if file_format == "npy" else "-"
    return (f"{name:<6} {file_format:<5} {batch_size:>5} {len(rows):>10,} {raw:>11,.0f} {whole:>12,.0f} "
            f"{steady:>13,.0f} {start_s:>7.2f} {whole / raw:>9.0%} {steady / raw:>10.0%} {verdict:>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--raw-seconds", type=float, default=2.0)
    parser.add_argument("--max-file-mib", type=int, default=1024)
    parser.add_argument("--rows", type=int, help="rows for every model (default: from --raw-seconds)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-sizes", default="256,1024")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--formats", default="npy", help="npy, and for information jsonl,csv")
    parser.add_argument("--text-rows", type=int, default=20_000)
    args = parser.parse_args()
    sizes = [int(size) for size in args.batch_sizes.split(",")]
    formats = args.formats.split(",")
    print(f"{'model':<6} {'input':<5} {'batch':>5} {'rows':>10} {'raw rows/s':>11} {'whole rows/s':>12} "
          f"{'steady rows/s':>13} {'start s':>7} {'whole/raw':>9} {'steady/raw':>10} {'target':>7}", flush=True)
    with tempfile.TemporaryDirectory(prefix="batch-bench-") as work:
        work_dir = Path(work)
        for name in args.models.split(","):
            layers = MODELS[name]
            model_bytes = to_bytes(random_mlp(layers, seed=0))
            model_path = work_dir / f"{name}.onnx"
            model_path.write_bytes(model_bytes)
            if "npy" not in formats:
                count = args.text_rows
            else:
                count = args.rows or rows_for(model_bytes, layers[0], max(sizes), args.raw_seconds,
                                              args.max_file_mib * 1024 * 1024)
            rows = np.random.default_rng(0).standard_normal((count, layers[0]), dtype=np.float32)
            input_path = work_dir / f"{name}.npy"
            if "npy" in formats:
                np.save(input_path, rows)
                for batch_size in sizes:
                    print(compare(name, model_bytes, model_path, input_path, "npy", rows, batch_size, args.repeats,
                                  work_dir), flush=True)
                input_path.unlink()
            for text_format in (fmt for fmt in formats if fmt != "npy"):
                text_rows = rows[:args.text_rows]
                text_path = work_dir / f"{name}.{text_format}"
                write_text(text_path, text_rows, text_format)
                print(compare(name, model_bytes, model_path, text_path, text_format, text_rows, sizes[0], args.repeats,
                              work_dir), flush=True)
                text_path.unlink()


if __name__ == "__main__":
    main()
