"""Decode-memory benchmark: a worker's peak memory and other clients' latency under huge JSON bodies.

    .venv/bin/python -m bench.decode_memory_bench [--worker-dir DIR] [--concurrency 6] [--values 16000000]
                                                  [--gzip/--no-gzip] [--matching-shape] [--json out.json]
                                                  [--worker-env SERVING_X=Y]

One worker (`python -m serving.worker --state-file`, run from --worker-dir, default this
checkout, on a free port, `bench.serve_bench.WorkerProcess`) serves one model built offline with the onnx
helper: input x of shape [None, None] FP32 (a dynamic non-batch dimension, so the body
limit is SERVING_MAX_BODY_BYTES), ReduceSum over axis 1 into y [None, 1]. Then
--concurrency requests are sent at once, each a JSON body whose data list has --values
numbers ("0.5", about 4 bytes a value: 16,000,000 values inflate to 64 MB), gzip-compressed
with Content-Encoding: gzip by default (about 62 KB on the wire). Their declared shape is
[1, 1] (a list far longer than its shape), or with --matching-shape [1, values] (a valid
request: only a bound on decoding memory, not a length check, can keep it small).

Meanwhile a probe (tools/traffic.py's steady load) sends a small valid /predict request
([1, 4]) 20 times a second and records each answer's status (0: none) and latency. The table gives the worker's VmHWM (peak
resident memory, /proc/PID/status) before and after, its VmRSS after, each big request's
status and seconds, and the probe's p50 / p99 / max latency and status counts. The worker
is stopped by PID (SIGTERM, then SIGKILL 15 s later).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import http.client
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import orjson
from onnx import TensorProto, helper, numpy_helper

from bench.serve_bench import WorkerProcess
from serving.contract import DesiredState, ModelState, Route
from tools.traffic import SteadyLoad

ROOT = Path(__file__).resolve().parents[1]
MODEL = "wide"
PATH = f"/v2/models/{MODEL}/infer"
BIG_TIMEOUT_S = 50.0  # client-side, per big request: every run stays under a minute
PROBE_RATE_PER_S = 20  # small valid requests a second, over 4 threads (tools/traffic.py)
PROBE_BODY = orjson.dumps({"model_name": MODEL, "inputs": [[1.0, 2.0, 3.0, 4.0]]})  # /predict


# ---- model, state, worker -------------------------------------------------------------


def wide_model() -> onnx.ModelProto:
    """x [batch, width] FP32 -> ReduceSum(axis 1, keepdims) -> y [batch, 1]: any width runs,
    and the answer stays one number a row however big the request."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="decode-memory-bench")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def write_state(workdir: Path) -> Path:
    data = wide_model().SerializeToString()
    model_path = workdir / f"{MODEL}.onnx"
    model_path.write_bytes(data)
    route = Route(version=1, weight=100, sha256=hashlib.sha256(data).hexdigest(), artifact_url=str(model_path),
                  signature={"batchable": True})  # ReduceSum keeps rows apart
    state_file = workdir / "state.json"
    state_file.write_bytes(orjson.dumps(DesiredState(generation=1, models={MODEL: ModelState(routes=(route,))}).to_dict()))
    return state_file


class Worker(WorkerProcess):
    """The benches' worker process (bench/serve_bench.py), and its memory."""

    def memory_mb(self) -> dict[str, float]:
        """VmHWM and VmRSS (MB) from /proc/PID/status; empty once the process is gone."""
        try:
            text = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return {}
        values = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0]) / 1024  # kB
        return values


# ---- clients --------------------------------------------------------------------------


def request(method: str, port: int, path: str, body: bytes | None = None, headers: dict | None = None,
            timeout_s: float = 30.0, connection: http.client.HTTPConnection | None = None) -> tuple[int, bytes]:
    own = connection is None
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        if own:
            connection.close()


def big_body(values: int, matching_shape: bool) -> bytes:
    shape = f"[1,{values}]" if matching_shape else "[1,1]"
    head = f'{{"inputs":[{{"name":"x","shape":{shape},"datatype":"FP32","data":['.encode()
    return head + b"0.5," * (values - 1) + b"0.5]}]}"


def send_big(port: int, body: bytes, headers: dict, results: list, index: int) -> None:
    started_s = time.perf_counter()
    try:
        status, answer = request("POST", port, PATH, body, headers, timeout_s=BIG_TIMEOUT_S)
        detail = "" if status == 200 else answer[:160].decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        status, detail = 0, f"{type(exc).__name__}: {exc}"
    results[index] = {"status": status, "seconds": time.perf_counter() - started_s, "detail": detail}


# ---- run and report -------------------------------------------------------------------


def measure(args, workdir: Path) -> dict:
    state_file = write_state(workdir)
    raw = big_body(args.values, args.matching_shape)
    headers = {"Content-Type": "application/json"}
    body = raw
    if args.gzip:
        body = gzip.compress(raw, compresslevel=9)
        headers["Content-Encoding"] = "gzip"
    Worker.extra_env = dict(item.split("=", 1) for item in args.worker_env)
    Worker.source_dir = args.worker_dir.resolve()
    with Worker(state_file, workdir / "cache") as worker:
        for _ in range(5):  # warm the connection path and the model
            status, answer = request("POST", worker.port, "/predict", PROBE_BODY, {"Content-Type": "application/json"})
            if status != 200:
                raise RuntimeError(f"the probe request failed: {status} {answer[:200]!r}")
        before = worker.memory_mb()
        results: list[dict | None] = [None] * args.concurrency
        with SteadyLoad([f"http://127.0.0.1:{worker.port}"], [PROBE_BODY], PROBE_RATE_PER_S, timeout_s=BIG_TIMEOUT_S) as probe:
            time.sleep(0.5)  # unloaded probe samples first
            started_s = time.perf_counter()
            threads = [threading.Thread(target=send_big, args=(worker.port, body, headers, results, index))
                       for index in range(args.concurrency)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            big_wall_s = time.perf_counter() - started_s
            time.sleep(0.5)
        time.sleep(0.2)
        after = worker.memory_mb()
        exit_code = worker.process.poll()  # None: still running when the run ended
    answers = probe.answers()
    latencies = [answer.at - answer.sent for answer in answers]
    statuses: dict[str, int] = {}
    for answer in answers:
        statuses[str(answer.status)] = statuses.get(str(answer.status), 0) + 1
    return {
        "worker_dir": str(args.worker_dir.resolve()), "concurrency": args.concurrency, "values": args.values,
        "gzip": args.gzip, "matching_shape": args.matching_shape, "json_body_bytes": len(raw), "wire_body_bytes": len(body),
        "worker_env": Worker.extra_env, "cores": os.cpu_count(), "load_average": os.getloadavg()[0],
        "vmhwm_before_mb": before.get("VmHWM", float("nan")), "vmhwm_after_mb": after.get("VmHWM", float("nan")),
        "vmrss_after_mb": after.get("VmRSS", float("nan")), "worker_exit_code": exit_code,
        "big_wall_s": big_wall_s, "big": results,
        "probe_p50_ms": _ms(latencies, 50), "probe_p99_ms": _ms(latencies, 99), "probe_max_ms": _ms(latencies, 100),
        "probe_statuses": statuses, "probe_samples": len(latencies),
    }


def _ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000) if values else float("nan")


def print_report(r: dict) -> None:
    shape = f"[1, {r['values']}]" if r["matching_shape"] else "[1, 1]"
    print(f"worker {r['worker_dir']}, {r['cores']} cores, load average {r['load_average']:.1f}")
    print(f"{r['concurrency']} requests at once, {r['values']:,} values, declared shape {shape}, "
          f"{r['json_body_bytes']:,} bytes of JSON, {r['wire_body_bytes']:,} on the wire"
          + (" (gzip)" if r["gzip"] else ""))
    print()
    print("| VmHWM before MB | VmHWM after MB | VmRSS after MB | big requests (status, s) | all big done s | "
          "probe p50 / p99 / max ms | probe statuses | worker |")
    print("|---:|---:|---:|---|---:|---|---|---|")
    big = ", ".join(f"{b['status']} {b['seconds']:.1f}" for b in r["big"])
    statuses = ", ".join(f"{status}: {n}" for status, n in sorted(r["probe_statuses"].items()))
    alive = "running" if r["worker_exit_code"] is None else f"exited {r['worker_exit_code']}"
    print(f"| {r['vmhwm_before_mb']:,.0f} | {r['vmhwm_after_mb']:,.0f} | {r['vmrss_after_mb']:,.0f} | {big} | {r['big_wall_s']:.1f} | "
          f"{r['probe_p50_ms']:.1f} / {r['probe_p99_ms']:.1f} / {r['probe_max_ms']:.1f} | {statuses} | {alive} |")
    details = sorted({b["detail"] for b in r["big"] if b["detail"]})
    for detail in details:
        print(f"  answer: {detail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-dir", type=Path, default=ROOT, help="directory holding the serving/ package to run")
    parser.add_argument("--concurrency", type=int, default=6, help="big requests sent at once")
    parser.add_argument("--values", type=int, default=16_000_000, help="numbers in each big request's data list")
    parser.add_argument("--gzip", action=argparse.BooleanOptionalAction, default=True,
                        help="send the big bodies gzip-compressed (Content-Encoding: gzip)")
    parser.add_argument("--matching-shape", action="store_true",
                        help="declare shape [1, values] (valid) instead of [1, 1] (a list longer than its shape)")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a SERVING_* setting for the worker under test (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="decode-memory-bench-") as tmp:
        report = measure(args, Path(tmp))
    print_report(report)
    if args.json:
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
