"""The open-loop generator in C (bench/open_loop_client.c), built with the machine's C
compiler on first use and run as a child process.

On two cores shared with the worker, the asyncio generator could neither send 3x the
small model's capacity nor stay out of the worker's way (0.4-0.8 cores); this one sends
the same schedule with the same client semantics on one thread and no allocation per
request. The results come back as a `LoadResult`, as the asyncio client's do.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from bench.serve_bench import LoadResult

SOURCE = Path(__file__).with_name("open_loop_client.c")
RECORD = np.dtype([("status", "<i4"), ("latency_s", "<f4"), ("send_lag_s", "<f4")])


def available() -> bool:
    return shutil.which("cc") is not None or shutil.which("gcc") is not None


def build() -> Path:
    """The compiled client, cached by the source's digest under the temp directory."""
    source = SOURCE.read_bytes()
    binary = Path(tempfile.gettempdir()) / f"open-loop-client-{hashlib.sha256(source).hexdigest()[:16]}"
    if not binary.exists():
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:  # the suite runs this client: no compiler is a failure, never a skip
            raise RuntimeError("bench/open_loop_client.c needs a C compiler (cc or gcc) on PATH")
        partial = binary.with_suffix(".partial")
        subprocess.run([compiler, "-O2", "-Wall", "-o", str(partial), str(SOURCE)], check=True)
        partial.replace(binary)
    return binary


def command(port: int, rate_per_s: float, duration_s: float, connections: int, max_connections: int,
            request_file: Path, out_file: Path) -> list[str]:
    """The C client's command line: `connections` opened before the clock starts, up to
    `max_connections` more opened by requests that find none free; records to `out_file`."""
    return [str(build()), str(port), f"{rate_per_s:.3f}", f"{duration_s:.3f}", str(connections),
            str(connections + max_connections), str(request_file), str(out_file)]


def open_loop(port: int, request: bytes, rate_per_s: float, duration_s: float, connections: int,
              max_connections: int = 6000) -> tuple[LoadResult, str]:
    """Runs the C client; returns its results and its one-line summary. Its connection
    slots are `connections` opened before the clock starts plus up to `max_connections`
    opened by requests that found none free (the asyncio client's bound)."""
    with tempfile.TemporaryDirectory(prefix="open-loop-") as tmp:
        request_file, out_file = Path(tmp) / "request.http", Path(tmp) / "records.bin"
        request_file.write_bytes(request)
        summary = subprocess.run(
            command(port, rate_per_s, duration_s, connections, max_connections, request_file, out_file),
            capture_output=True, text=True, check=True, timeout=duration_s + 60,
        ).stdout.strip()
        records = np.fromfile(out_file, dtype=RECORD)
    result = LoadResult(float(summary.split("elapsed_s ")[1]))
    for status in np.unique(records["status"]):
        result.latencies_s[int(status)] = records["latency_s"][records["status"] == status].astype(float).tolist()
    lags = records["send_lag_s"]
    result.send_lags_s = lags[~np.isnan(lags)].astype(float).tolist()
    return result, summary
