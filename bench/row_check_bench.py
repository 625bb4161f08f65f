"""Peak memory of the console's upload-time check of a batch input's first row, for a row
far wider than the model takes: what a hostile upload costs before it is refused.

    PYTHONPATH=. .venv/bin/python -m bench.row_check_bench [--values 10000000] [--width 64]

Writes one CSV and one JSONL line of ``--values`` numbers, runs ``check_batch_input``
against a model input of ``--width`` values under tracemalloc, and prints a table of the
peak Python allocation and the time each took.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from serving.jobs.formats import FormatError, InputLayout, check_batch_input


def measure(path: Path, file_format: str, layout: InputLayout) -> tuple[float, float, str]:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        check_batch_input(path, file_format, [layout])
        outcome = "accepted"
    except FormatError as error:
        outcome = str(error)
    elapsed_s = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 1e6, elapsed_s, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=10_000_000)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    layout = InputLayout("input", np.dtype(np.float32), (args.width,))
    values = ",".join(["1.5"] * args.values)
    with tempfile.TemporaryDirectory() as directory:
        files = {"csv": Path(directory) / "wide.csv", "jsonl": Path(directory) / "wide.jsonl"}
        files["csv"].write_text(values + "\n")
        files["jsonl"].write_text("[" + values + "]\n")
        print("| format | line | peak MB | seconds | outcome |\n|---|---:|---:|---:|---|")
        for file_format, path in files.items():
            peak_mb, elapsed_s, outcome = measure(path, file_format, layout)
            print(f"| {file_format} | {path.stat().st_size / 1e6:.0f} MB | {peak_mb:.1f} | {elapsed_s:.2f} | {outcome[:90]} |")


if __name__ == "__main__":
    main()
