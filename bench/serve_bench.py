"""Serving benchmark: raw ONNX Runtime ceiling, then a real worker over HTTP on loopback.

    .venv/bin/python -m bench.serve_bench [--duration-s 5] [--client auto|wrk|python] [--json out.json]

Builds its own models (registry.building.onnx_build), measures in-process ORT samples/s per batch
size, starts `python -m serving.worker` as a subprocess, drives it closed-loop at
concurrency 1/16/64 (wrk when installed, else the asyncio client below), then runs an
open-loop overload at 3x the measured capacity with a latency target so the worker sheds.
Bounded: every run has a fixed duration, and everything stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import orjson

from registry.building.onnx_build import random_mlp, to_bytes
from serving.contract import BatchPolicy, DesiredState, ModelState, Route

ROOT = Path(__file__).resolve().parents[1]
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
MODELS = {"small": [64, 128, 10], "mid": [1024, 4096, 4096, 1000]}


# ---- load generator -------------------------------------------------------------------


@dataclass
class LoadResult:
    seconds: float
    latencies_s: dict[int, list[float]] = field(default_factory=dict)  # status -> latencies
    reported_ms: dict[float, float] = field(default_factory=dict)  # percentiles a tool reported (wrk)
    send_lags_s: list[float] = field(default_factory=list)  # open loop: from the scheduled time to the write

    def add(self, status: int, latency_s: float) -> None:
        self.latencies_s.setdefault(status, []).append(latency_s)

    @property
    def count(self) -> int:
        return sum(len(values) for values in self.latencies_s.values())

    def percentile_ms(self, status: int, q: float) -> float:
        if status == 200 and q in self.reported_ms:
            return self.reported_ms[q]
        values = self.latencies_s.get(status) or [float("nan")]
        return float(np.percentile(values, q) * 1000)


def http_request(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def read_response(reader: asyncio.StreamReader) -> int:
    return (await read_answer(reader))[0]


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """One response's status, and whether the server keeps the connection open."""
    head = await reader.readuntil(b"\r\n\r\n")
    match = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
    await reader.readexactly(int(match.group(1)) if match else 0)
    return int(head[9:12]), re.search(rb"^connection: *close", head, re.IGNORECASE | re.MULTILINE) is None


async def closed_loop(port: int, request: bytes, concurrency: int, duration_s: float) -> LoadResult:
    """`concurrency` keep-alive connections, each sending its next request on the answer."""
    result, stop_at = LoadResult(duration_s), time.perf_counter() + duration_s

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while (started := time.perf_counter()) < stop_at:
            writer.write(request)
            status = await read_response(reader)
            result.add(status, time.perf_counter() - started)
        writer.close()

    await asyncio.gather(*(connection() for _ in range(concurrency)))
    return result


async def open_loop(port: int, request: bytes, rate_per_s: float, duration_s: float, connections: int) -> LoadResult:
    """Requests at a fixed rate whatever the answers; a request finding no free connection
    counts as status 0 (client-side drop) so the offered rate is honest."""
    result, free = LoadResult(duration_s), asyncio.Queue()
    for _ in range(connections):
        free.put_nowait(await asyncio.open_connection("127.0.0.1", port))

    async def one(connection, scheduled_s: float) -> None:
        reader, writer = connection
        writer.write(request)
        status = await read_response(reader)
        result.add(status, time.perf_counter() - scheduled_s)
        free.put_nowait(connection)

    tasks, interval_s, started_s = [], 1.0 / rate_per_s, time.perf_counter()
    for index in range(int(rate_per_s * duration_s)):
        scheduled_s = started_s + index * interval_s
        delay_s = scheduled_s - time.perf_counter()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        if free.empty():
            result.add(0, 0.0)
            continue
        tasks.append(asyncio.ensure_future(one(free.get_nowait(), scheduled_s)))
    await asyncio.gather(*tasks)
    return result


def wrk_closed_loop(port: int, path: str, body_file: Path, concurrency: int, duration_s: float) -> LoadResult:
    """wrk (C, one thread) for the closed-loop runs: less client CPU on a 2-core box."""
    script = body_file.with_suffix(".lua")
    script.write_text(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                      f'local f = io.open("{body_file}", "rb")\nwrk.body = f:read("*a")\nf:close()\n')
    output = subprocess.run(
        ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(duration_s))}s", "--latency", "-s", str(script),
         f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True, check=True,
    ).stdout
    total, seconds = re.search(r"(\d+) requests in ([\d.]+)s", output).groups()
    result, total = LoadResult(float(seconds)), int(total)
    errors = int((re.search(r"Non-2xx or 3xx responses: (\d+)", output) or [0, 0])[1])
    result.reported_ms = {50: _wrk_ms(output, "50"), 99: _wrk_ms(output, "99")}  # wrk covers all statuses
    result.latencies_s[200] = [float("nan")] * (total - errors)
    if errors:
        result.latencies_s[503] = [0.0] * errors
    return result


def _wrk_ms(output: str, q: str) -> float:
    value, unit = re.search(rf"^\s+{q}%\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


# ---- raw ceiling ----------------------------------------------------------------------


def raw_ceiling(model_path: Path, seconds_per_size: float, batch_sizes=BATCH_SIZES, config=None) -> dict[int, float]:
    """In-process ORT samples/s per batch size, same session options and device as the
    worker under test (or `config`'s): with `--worker-env SERVING_DEVICE=cuda` a GPU box
    measures raw ORT-CUDA against the worker on CUDA."""
    from serving.config import ServingConfig
    from serving.engine import providers, resolve_device, session_options

    config = config or ServingConfig(device=WorkerProcess.extra_env.get("SERVING_DEVICE", "cpu"))
    session = ort.InferenceSession(str(model_path), session_options(config), providers=providers(config, resolve_device(config)))
    row_shape = session.get_inputs()[0].shape[1:]  # one float32 input, batch axis first
    ceiling = {}
    for rows in batch_sizes:
        feeds = {session.get_inputs()[0].name: np.random.default_rng(0).standard_normal((rows, *row_shape), dtype=np.float32)}
        session.run(None, feeds)
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds_per_size:
            session.run(None, feeds)
            runs += 1
        ceiling[rows] = runs * rows / (time.perf_counter() - started)
    return ceiling


# ---- worker ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_models(directory: Path) -> dict[str, tuple[Path, str]]:
    return {name: write_model(directory, name, random_mlp(sizes, seed=7)) for name, sizes in MODELS.items()}


def write_model(directory: Path, name: str, model) -> tuple[Path, str]:
    """`directory/name.onnx`, and its sha256 (what a state's route names)."""
    data = to_bytes(model)
    path = directory / f"{name}.onnx"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def desired_state(models: dict[str, tuple[Path, str]], latency_target_s: float | None) -> dict:
    batching = BatchPolicy(max_batch_size=64, max_queue_size=1024, latency_target_s=latency_target_s)
    return DesiredState(generation=1, models={
        name: ModelState(routes=(Route(version=1, weight=100, sha256=sha, artifact_url=str(path),
                                       signature={"batchable": True}),),  # MLPs keep rows apart
                         batching=batching)
        for name, (path, sha) in models.items()
    }).to_dict()


class WorkerProcess:
    extra_env: dict[str, str] = {}  # --worker-env settings, for every worker the bench starts
    source_dir: Path = ROOT  # --worker-dir: run the serving package of another checkout (before/after)

    def __init__(self, state_file: Path, cache_dir: Path):
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(self.source_dir), "SERVING_LOG_LEVEL": "warning", "SERVING_DEVICE": "cpu",
               "SERVING_CACHE_DIR": str(cache_dir), **self.extra_env}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving.worker", "--port", str(self.port), "--state-file", str(state_file)],
            cwd=self.source_dir, env=env,
        )

    def __enter__(self) -> WorkerProcess:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        self.stop()  # `with` does not call __exit__ when __enter__ raises
        raise RuntimeError("worker did not become ready")

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM by PID; SIGKILL if it has not exited 15 s later."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=15)


# ---- runs and report ------------------------------------------------------------------


def infer_body(width: int) -> bytes:
    row = np.random.default_rng(1).standard_normal(width, dtype=np.float32)
    return orjson.dumps({"inputs": [{"name": "input", "shape": [1, width], "datatype": "FP32", "data": row.tolist()}]})


def closed_row(name: str, concurrency: int, result: LoadResult, ceiling_64: float) -> dict:
    served = len(result.latencies_s.get(200, [])) / result.seconds
    return {
        "model": name, "concurrency": concurrency, "req_s": result.count / result.seconds,
        "p50_ms": result.percentile_ms(200, 50), "p99_ms": result.percentile_ms(200, 99),
        "errors": result.count - len(result.latencies_s.get(200, [])), "served_samples_s": served,
        "ceiling_b64": ceiling_64, "pct_ceiling": 100 * served / ceiling_64,
    }


def print_table(rows: list[dict]) -> None:
    print("| model | conc | req/s | p50 ms | p99 ms | errors | served samples/s | raw ceiling (b64) | % ceiling |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['model']} | {row['concurrency']} | {row['req_s']:,.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
              f"{row['errors']} | {row['served_samples_s']:,.0f} | {row['ceiling_b64']:,.0f} | {row['pct_ceiling']:.0f}% |")


def run_closed(args, port: int, name: str, width: int, workdir: Path, ceiling_64: float) -> list[dict]:
    body = infer_body(width)
    body_file = workdir / f"{name}.json"
    body_file.write_bytes(body)
    path = f"/v2/models/{name}/infer"
    asyncio.run(closed_loop(port, http_request(path, body), 4, 1.0))  # warm connections and caches
    rows = []
    for concurrency in (1, 16, 64):
        if args.client == "wrk":
            result = wrk_closed_loop(port, path, body_file, concurrency, args.duration_s)
        else:
            result = asyncio.run(closed_loop(port, http_request(path, body), concurrency, args.duration_s))
        rows.append(closed_row(name, concurrency, result, ceiling_64))
    return rows


def run_overload(args, models, workdir: Path, name: str, capacity_req_s: float, unloaded_p99_ms: float) -> dict:
    """3x capacity, open loop, against a worker whose latency target is 2x the unloaded p99."""
    target_s = 2 * unloaded_p99_ms / 1000
    state_file = workdir / "overload.json"
    state_file.write_bytes(orjson.dumps(desired_state({name: models[name]}, target_s)))
    request = http_request(f"/v2/models/{name}/infer", infer_body(MODELS[name][0]))
    with WorkerProcess(state_file, workdir / "cache") as worker:
        asyncio.run(closed_loop(worker.port, request, 4, 1.0))
        result = asyncio.run(open_loop(worker.port, request, 3 * capacity_req_s, args.duration_s, connections=512))
    return {
        "model": name, "offered_req_s": 3 * capacity_req_s, "latency_target_ms": target_s * 1000,
        "accepted_req_s": len(result.latencies_s.get(200, [])) / result.seconds,
        "accepted_p50_ms": result.percentile_ms(200, 50), "accepted_p99_ms": result.percentile_ms(200, 99),
        "rejected_503": len(result.latencies_s.get(503, [])), "rejected_p50_ms": result.percentile_ms(503, 50),
        "rejected_p99_ms": result.percentile_ms(503, 99), "status_504": len(result.latencies_s.get(504, [])),
        "client_drops": len(result.latencies_s.get(0, [])), "unloaded_p99_ms": unloaded_p99_ms,
    }


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every serving benchmark takes: the client, and the worker under test."""
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a SERVING_* setting for the worker under test (repeatable)")
    parser.add_argument("--worker-dir", type=Path, default=ROOT,
                        help="directory holding the serving/ package to run (default: this checkout)")


def apply_common_arguments(args: argparse.Namespace) -> None:
    WorkerProcess.extra_env = dict(item.split("=", 1) for item in args.worker_env)
    WorkerProcess.source_dir = args.worker_dir.resolve()
    if args.client == "auto":
        args.client = "wrk" if shutil.which("wrk") else "python"
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--ceiling-s", type=float, default=1.0, help="seconds per batch size for the raw ceiling")
    parser.add_argument("--overload-model", default="mid", choices=tuple(MODELS))
    parser.add_argument("--skip-overload", action="store_true")
    add_common_arguments(parser)
    args = parser.parse_args()
    apply_common_arguments(args)
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        report = bench(args, Path(tmp))
    if args.json:
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


def bench(args, workdir: Path) -> dict:
    models = write_models(workdir)
    ceilings = {name: raw_ceiling(path, args.ceiling_s) for name, (path, _) in models.items()}
    print(f"raw ONNX Runtime ceiling, samples/s ({os.cpu_count()} cores):")
    for name, ceiling in ceilings.items():
        print(f"  {name}: " + ", ".join(f"b{rows} {value:,.0f}" for rows, value in ceiling.items()))
    state_file = workdir / "state.json"
    state_file.write_bytes(orjson.dumps(desired_state(models, None)))
    rows = []
    with WorkerProcess(state_file, workdir / "cache") as worker:
        for name in models:
            rows += run_closed(args, worker.port, name, MODELS[name][0], workdir, ceilings[name][64])
    print(f"\nclosed loop, client {args.client}, {args.duration_s:g} s per run:")
    print_table(rows)
    by_key = {(row["model"], row["concurrency"]): row for row in rows}
    report = {"cores": os.cpu_count(), "client": args.client, "worker_env": WorkerProcess.extra_env,
              "worker_dir": str(WorkerProcess.source_dir), "load_average": os.getloadavg(),
              "ceilings": ceilings, "closed": rows}
    if args.skip_overload:
        return report
    name = args.overload_model
    overload = run_overload(args, models, workdir, name, by_key[(name, 64)]["req_s"], by_key[(name, 1)]["p99_ms"])
    print("\noverload (open loop, python client):")
    print("  " + ", ".join(f"{key} {value:,.2f}" if isinstance(value, float) else f"{key} {value}" for key, value in overload.items()))
    return {**report, "overload": overload}


if __name__ == "__main__":
    main()
