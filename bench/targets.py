"""The issue's speed targets, each measured against its reference in the same run.

    .venv/bin/python -m bench.targets [--rounds 3] [--duration-s 5] [--json out.json]   # about 3 minutes

One worker (`python -m serving.worker` from a state file: max_batch_size 64, the
default max_queue_delay_s, one row per request) serves three models: the small MLP
(64→128→10), the mid MLP (1024→4096→4096→1000) and a small conv net
(`registry.building.onnx_build.random_convnet`, [N,3,32,32] → 10). Beside it runs
`bench.http_ceiling`'s `batcher` reference (a bare ASGI handler with a greedy asyncio
batcher over the same small MLP). Each round measures every pair back to back, the
order within a pair alternating between rounds, with `wrk -t1` (one connection per
concurrent client):

  small, c64   worker V2 JSON vs the batcher reference: req/s ratio ≥ 0.95, p99 ≤ 6 ms
  small, c1    worker vs the batcher reference: ≥ 4,000 req/s and ratio ≥ 1.00
  mid, c64     worker V2 JSON samples/s vs raw ONNX Runtime at batch 64 (in-process)  ≥ 0.80
  conv, c64    worker V2 binary tensors (in and out) vs raw ONNX Runtime at batch 64  ≥ 0.75
  conv, c64    (no goal) `bench.http_ceiling`'s bare `raw1write` handler, the same binary POST
               and no model, vs the same ceiling: the HTTP stack's own bound on this machine

The raw ceiling is the better of two in-process runs at batch 64: with the worker's
session options (ONNX Runtime's default intra-op threads, one per core) and with one
intra-op thread, which is the faster of the two while neighbours keep a core busy.

The table gives the median over rounds of each side and of the per-round ratios (each
ratio from a pair measured within seconds of each other), and the server's CPU time per
request from /proc/PID/task/*/stat around each wrk run, split into the event-loop
thread and every other thread (dispatch + ONNX Runtime), which moves much less than
req/s when the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from bench.http_ceiling import TICKS_S, lua_script, start, wrk
from bench.serve_bench import (
    MODELS,
    WorkerProcess,
    desired_state,
    infer_body,
    raw_ceiling,
    write_model,
    write_models,
)
from registry.building.onnx_build import random_convnet
from serving.config import ServingConfig

CONV_SHAPE = (3, 32, 32)


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    goal: str
    reference: str  # what `ours` is compared with


TARGETS = (
    Target("small_c64", "small MLP, c64: worker ÷ bare ASGI + greedy batcher (req/s)", "≥ 0.95", "batcher c64"),
    Target("small_c64_p99", "small MLP, c64: worker p99 ms", "≤ 6 ms", "batcher c64 p99"),
    Target("small_c1", "small MLP, c1: worker ÷ bare ASGI + greedy batcher (req/s)", "≥ 1.00", "batcher c1"),
    Target("small_c1_abs", "small MLP, c1: worker req/s", "≥ 4,000", "4,000"),
    Target("mid_c64", "mid MLP, c64, JSON: worker ÷ raw ORT batch 64 (samples/s)", "≥ 0.80", "raw ORT b64"),
    Target("conv_c64", "conv net, c64, binary tensors: worker ÷ raw ORT batch 64", "≥ 0.75", "raw ORT b64"),
    # No goal: what a bare ASGI handler that only reads the same 12 KB POST and answers a
    # fixed body reaches, against the same ceiling (the HTTP stack's own bound here).
    Target("conv_http", "conv net, c64: bare ASGI handler, same POST, no model ÷ raw ORT b64", "(bound)", "raw ORT b64"),
)


# ---- CPU per thread -------------------------------------------------------------------


def thread_cpu_s(pid: int) -> tuple[float, float]:
    """(event-loop thread, every other thread) CPU seconds of process `pid` so far. The
    loop is the main thread (tid == pid); the rest are dispatch, ORT and control threads."""
    loop_s = other_s = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended while we read
            continue
        cpu = (int(fields[11]) + int(fields[12])) / TICKS_S
        if task.name == str(pid):
            loop_s += cpu
        else:
            other_s += cpu
    return loop_s, other_s


def measured_wrk(pid: int, url: str, concurrency: int, duration_s: float, script: Path) -> dict:
    before = thread_cpu_s(pid)
    result = wrk(url, concurrency, duration_s, script)
    after = thread_cpu_s(pid)
    requests = max(result["requests"], 1)
    result["loop_cpu_us"] = (after[0] - before[0]) / requests * 1e6
    result["other_cpu_us"] = (after[1] - before[1]) / requests * 1e6
    result["load"] = os.getloadavg()[0]
    return result


# ---- the run --------------------------------------------------------------------------


def write_all_models(workdir: Path) -> dict[str, tuple[Path, str]]:
    models = write_models(workdir)
    models["conv"] = write_model(workdir, "conv", random_convnet(seed=7))
    return models


def binary_body(shape: tuple[int, ...]) -> tuple[bytes, int]:
    """A V2 request with one FP32 row as a binary tensor, asking for binary outputs: (body,
    JSON header length)."""
    row = np.random.default_rng(1).standard_normal((1, *shape), dtype=np.float32)
    header = orjson.dumps({
        "inputs": [{"name": "input", "shape": list(row.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": row.nbytes}}],
        "parameters": {"binary_data_output": True},
    })
    return header + row.tobytes(), len(header)


def scripts(workdir: Path) -> dict[str, Path]:
    conv_body, header_length = binary_body(CONV_SHAPE)
    return {
        "small": lua_script(workdir / "small.lua", infer_body(MODELS["small"][0])),
        "mid": lua_script(workdir / "mid.lua", infer_body(MODELS["mid"][0])),
        "conv": lua_script(workdir / "conv.lua", conv_body, {
            "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)}),
    }


def one_round(index: int, args, worker: WorkerProcess, batcher, bare, models, lua: dict[str, Path]) -> dict:
    """Every pair once, back to back; odd rounds measure the reference first."""
    worker_url = f"http://127.0.0.1:{worker.port}/v2/models/{{}}/infer"
    batcher_process, batcher_port = batcher
    bare_process, bare_port = bare
    measures = {
        "small_c64": (lambda: measured_wrk(worker.process.pid, worker_url.format("small"), 64, args.duration_s, lua["small"]),
                      lambda: measured_wrk(batcher_process.pid, f"http://127.0.0.1:{batcher_port}/", 64, args.duration_s,
                                           lua["small"])),
        "small_c1": (lambda: measured_wrk(worker.process.pid, worker_url.format("small"), 1, args.duration_s, lua["small"]),
                     lambda: measured_wrk(batcher_process.pid, f"http://127.0.0.1:{batcher_port}/", 1, args.duration_s,
                                          lua["small"])),
        "mid_c64": (lambda: measured_wrk(worker.process.pid, worker_url.format("mid"), 64, args.duration_s, lua["mid"]),
                    lambda: raw_b64(models["mid"][0], args.ceiling_s)),
        "conv_c64": (lambda: measured_wrk(worker.process.pid, worker_url.format("conv"), 64, args.duration_s, lua["conv"]),
                     lambda: raw_b64(models["conv"][0], args.ceiling_s)),
        "conv_http": (lambda: measured_wrk(bare_process.pid, f"http://127.0.0.1:{bare_port}/", 64, args.duration_s,
                                           lua["conv"]), None),
    }
    results = {}
    for key, (ours, reference) in measures.items():
        if reference is None:  # compared with the ceiling measured just before
            mine, ref = ours(), results["conv_c64"]["reference"]
        elif index % 2:
            ref, mine = reference(), ours()
        else:
            mine, ref = ours(), reference()
        results[key] = {"ours": mine, "reference": ref}
        threads = ref.get("by_intra_op_threads")
        detail = "" if threads is None else " (" + ", ".join(
            f"{label} {value['samples_s']:,.0f}" for label, value in threads.items()) + ")"
        print(f"  round {index + 1} {key}: ours {mine['req_s']:,.0f}/s p99 {mine['p99_ms']:.2f} ms "
              f"(loop {mine['loop_cpu_us']:.0f} + other {mine['other_cpu_us']:.0f} us CPU/req), "
              f"reference {ref['req_s']:,.0f}/s{detail}, load {os.getloadavg()[0]:.2f}", flush=True)
    return results


def raw_b64(model_path: Path, seconds: float) -> dict:
    """Raw ORT at batch 64, in this process: the better of the worker's session options
    (ORT's default intra-op threads) and one intra-op thread, which wins when neighbours
    keep a core busy, so the ceiling is the machine's, whatever its load."""
    by_threads = {}
    device = WorkerProcess.extra_env.get("SERVING_DEVICE", "cpu")  # the device the worker under test uses
    for label, config in (("worker's options", ServingConfig(device=device)), ("1 intra-op thread", ServingConfig(device=device, intra_op_threads=1))):
        started = time.process_time()
        samples_s = raw_ceiling(model_path, seconds / 2, batch_sizes=(64,), config=config)[64]
        by_threads[label] = {"samples_s": samples_s, "cpu_s": time.process_time() - started}
    return {"req_s": max(value["samples_s"] for value in by_threads.values()), "by_intra_op_threads": by_threads,
            "p99_ms": float("nan"), "loop_cpu_us": float("nan"), "other_cpu_us": float("nan"), "load": os.getloadavg()[0]}


def summarize(rounds: list[dict]) -> list[dict]:
    def med(key, side, field):
        return statistics.median(r[key][side][field] for r in rounds)

    def ratio(key):
        values = [r[key]["ours"]["req_s"] / r[key]["reference"]["req_s"] for r in rounds]
        return statistics.median(values), min(values), max(values)

    rows = []
    for target in TARGETS:
        if target.key == "small_c64_p99":
            ours, reference = med("small_c64", "ours", "p99_ms"), med("small_c64", "reference", "p99_ms")
            value, low, high = ours, *(min(r["small_c64"]["ours"]["p99_ms"] for r in rounds),
                                       max(r["small_c64"]["ours"]["p99_ms"] for r in rounds))
            met = ours <= 6.0
        elif target.key == "small_c1_abs":
            ours, reference = med("small_c1", "ours", "req_s"), 4000.0
            values = [r["small_c1"]["ours"]["req_s"] / 4000 for r in rounds]
            value, low, high = statistics.median(values), min(values), max(values)
            met = ours >= 4000
        else:
            ours, reference = med(target.key, "ours", "req_s"), med(target.key, "reference", "req_s")
            value, low, high = ratio(target.key)
            met = None if target.goal == "(bound)" else value >= float(target.goal.split()[1])
        source = "small_c64" if target.key == "small_c64_p99" else "small_c1" if target.key == "small_c1_abs" else target.key
        rows.append({
            "target": target.key, "label": target.label, "ours": ours, "reference": reference,
            "reference_is": target.reference, "ratio": value, "ratio_min": low, "ratio_max": high,
            "goal": target.goal, "met": met,
            "loop_cpu_us": med(source, "ours", "loop_cpu_us"), "other_cpu_us": med(source, "ours", "other_cpu_us"),
            "reference_cpu_us": med(source, "reference", "loop_cpu_us") + med(source, "reference", "other_cpu_us"),
        })
    return rows


def print_table(rows: list[dict], rounds: int) -> None:
    print(f"\nmedian of {rounds} rounds (ratio: median of the per-round ratios, min–max in brackets)\n")
    print("| target | ours | reference | ratio | goal | met? |")
    print("|---|---:|---:|---:|---|---|")
    for row in rows:
        if row["target"] == "small_c64_p99":
            ratio = f"{row['ratio']:.2f} ms ({row['ratio_min']:.2f}–{row['ratio_max']:.2f})"
            ours, reference = f"{row['ours']:.2f} ms", f"{row['reference']:.2f} ms"
        else:
            ratio = f"{row['ratio']:.2f} ({row['ratio_min']:.2f}–{row['ratio_max']:.2f})"
            ours, reference = f"{row['ours']:,.0f}", f"{row['reference']:,.0f} ({row['reference_is']})"
        met = "—" if row["met"] is None else "yes" if row["met"] else "no"
        print(f"| {row['label']} | {ours} | {reference} | {ratio} | {row['goal']} | {met} |")
    print("\nserver CPU per request (median; loop = the event-loop thread, other = dispatch + ONNX Runtime threads;"
          " conv_http: the bare handler's):\n")
    print("| measure | loop µs/req | other µs/req | reference server µs/req |")
    print("|---|---:|---:|---:|")
    for row in rows:
        if row["target"] in ("small_c64_p99", "small_c1_abs"):
            continue
        reference = "—" if np.isnan(row["reference_cpu_us"]) else f"{row['reference_cpu_us']:.0f}"
        print(f"| {row['target']} | {row['loop_cpu_us']:.0f} | {row['other_cpu_us']:.0f} | {reference} |")


def run(args, workdir: Path) -> dict:
    models = write_all_models(workdir)
    state_file = workdir / "state.json"
    state_file.write_bytes(orjson.dumps(desired_state(models, None)))
    lua = scripts(workdir)
    load_before = os.getloadavg()
    print(f"{os.cpu_count()} cores, load average before: {' '.join(f'{x:.2f}' for x in load_before)}", flush=True)
    batcher = start("batcher", workdir, models["small"][0], state_file, {}, None)
    bare = start("raw1write", workdir, models["small"][0], state_file, {}, None)  # responses in one write, as ours
    try:
        with WorkerProcess(state_file, workdir / "cache") as worker:
            for name in ("small", "mid", "conv"):  # connections, caches and the latency models
                wrk(f"http://127.0.0.1:{worker.port}/v2/models/{name}/infer", 8, 1, lua[name])
            wrk(f"http://127.0.0.1:{batcher[1]}/", 8, 1, lua["small"])
            rounds = [one_round(index, args, worker, batcher, bare, models, lua) for index in range(args.rounds)]
    finally:
        for process, _ in (batcher, bare):
            process.terminate()
            process.wait(timeout=15)
    rows = summarize(rounds)
    print_table(rows, args.rounds)
    load_after = os.getloadavg()
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in load_after)}")
    return {"cores": os.cpu_count(), "load_before": load_before, "load_after": load_after, "rounds": rounds,
            "targets": rows, "duration_s": args.duration_s, "worker_dir": str(WorkerProcess.source_dir),
            "worker_env": WorkerProcess.extra_env}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--ceiling-s", type=float, default=3.0, help="seconds per raw ONNX Runtime measurement")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a SERVING_* setting for the worker under test (repeatable)")
    parser.add_argument("--worker-dir", type=Path, default=Path(__file__).resolve().parents[1],
                        help="directory holding the serving/ package to run (default: this checkout)")
    args = parser.parse_args()
    WorkerProcess.extra_env = dict(item.split("=", 1) for item in args.worker_env)
    WorkerProcess.source_dir = args.worker_dir.resolve()
    with tempfile.TemporaryDirectory(prefix="targets-") as tmp:
        report = run(args, Path(tmp))
    if args.json:
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


if __name__ == "__main__":
    main()
