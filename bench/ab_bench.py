"""Two workers, A and B, measured in alternating pairs in one run: is B faster than A?

    .venv/bin/python -m bench.ab_bench --a-dir /tmp/before [--b-dir .] [--a-env K=V] [--b-env K=V]
        [--scenarios small_c1 small_c64 mid_c64 conv_c64] [--pairs 3] [--duration-s 4]

A and B are `python -m serving.worker` run from two checkouts (`--a-dir`, `--b-dir`: the
directory holding `serving/`) or with two sets of SERVING_* settings, both started
before the first measurement and serving bench.targets' three models from the same
state. Each scenario is measured in `--pairs` pairs, A then B and B then A alternately,
with `wrk -t1` (the same scripts as bench.targets). The table gives each pair's req/s
and the worker's CPU per request (event-loop thread + every other thread), then the
medians and B ÷ A: CPU per request is the steadier figure on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import orjson

from bench.serve_bench import WorkerProcess, desired_state
from bench.targets import measured_wrk, scripts, write_all_models

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {  # name -> (model, concurrency)
    "small_c1": ("small", 1), "small_c64": ("small", 64), "mid_c64": ("mid", 64), "conv_c64": ("conv", 64),
    "mid_c1": ("mid", 1), "conv_c1": ("conv", 1), "small_c2048": ("small", 2048),
}


def start_worker(directory: Path, env: dict[str, str], state_file: Path, cache_dir: Path) -> WorkerProcess:
    WorkerProcess.source_dir, WorkerProcess.extra_env = directory.resolve(), env
    return WorkerProcess(state_file, cache_dir).__enter__()


def measure(worker: WorkerProcess, scenario: str, lua: dict[str, Path], duration_s: float) -> dict:
    model, concurrency = SCENARIOS[scenario]
    url = f"http://127.0.0.1:{worker.port}/v2/models/{model}/infer"
    result = measured_wrk(worker.process.pid, url, concurrency, duration_s, lua[model])
    result["cpu_us"] = result["loop_cpu_us"] + result["other_cpu_us"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-dir", type=Path, default=ROOT)
    parser.add_argument("--b-dir", type=Path, default=ROOT)
    parser.add_argument("--a-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--scenarios", nargs="+", default=["small_c1", "small_c64", "mid_c64", "conv_c64"],
                        choices=tuple(SCENARIOS))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=4.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"A: {args.a_dir} {' '.join(args.a_env)}\nB: {args.b_dir} {' '.join(args.b_env)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ab-bench-") as tmp:
        workdir = Path(tmp)
        models = write_all_models(workdir)
        state_file = workdir / "state.json"
        state_file.write_bytes(orjson.dumps(desired_state(models, None)))
        lua = scripts(workdir)
        workers = {}
        try:
            for side, directory, env in (("A", args.a_dir, args.a_env), ("B", args.b_dir, args.b_env)):
                workers[side] = start_worker(directory, dict(item.split("=", 1) for item in env), state_file,
                                             workdir / f"cache-{side}")
            for worker in workers.values():  # connections, caches and the latency models
                for scenario in args.scenarios:
                    measure(worker, scenario, lua, 1)
            results = run_pairs(args, workers, lua)
        finally:
            for worker in workers.values():
                worker.__exit__(None, None, None)
    rows = summarize(results)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_bytes(orjson.dumps({"pairs": results, "summary": rows, "a_dir": str(args.a_dir),
                                            "b_dir": str(args.b_dir), "a_env": args.a_env, "b_env": args.b_env},
                                           option=orjson.OPT_INDENT_2))


def run_pairs(args, workers: dict[str, WorkerProcess], lua: dict[str, Path]) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {scenario: [] for scenario in args.scenarios}
    for index in range(args.pairs):
        order = ("A", "B") if index % 2 == 0 else ("B", "A")
        for scenario in args.scenarios:
            pair = {side: measure(workers[side], scenario, lua, args.duration_s) for side in order}
            results[scenario].append(pair)
            print(f"  pair {index + 1} {scenario}: " + ", ".join(
                f"{side} {pair[side]['req_s']:,.0f} req/s {pair[side]['cpu_us']:.0f} us CPU/req "
                f"(loop {pair[side]['loop_cpu_us']:.0f}) p99 {pair[side]['p99_ms']:.2f} ms" for side in ("A", "B"))
                + f", load {os.getloadavg()[0]:.2f}", flush=True)
    return results


def summarize(results: dict[str, list[dict]]) -> list[dict]:
    print("\n| scenario | A req/s (pairs) | B req/s (pairs) | B ÷ A req/s, median | A CPU µs/req | B CPU µs/req | B ÷ A CPU |")
    print("|---|---|---|---:|---:|---:|---:|")
    rows = []
    for scenario, pairs in results.items():
        ratios = [pair["B"]["req_s"] / pair["A"]["req_s"] for pair in pairs]
        cpu = {side: statistics.median(pair[side]["cpu_us"] for pair in pairs) for side in ("A", "B")}
        row = {"scenario": scenario, "req_s_ratio": statistics.median(ratios), "cpu_us": cpu,
               "cpu_ratio": cpu["B"] / cpu["A"]}
        rows.append(row)
        a_runs, b_runs = (", ".join(f"{pair[side]['req_s']:,.0f}" for pair in pairs) for side in ("A", "B"))
        print(f"| {scenario} | {a_runs} | {b_runs} | {row['req_s_ratio']:.2f} | "
              f"{cpu['A']:.0f} | {cpu['B']:.0f} | {row['cpu_ratio']:.2f} |")
    return rows


if __name__ == "__main__":
    main()
