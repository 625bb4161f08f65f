"""Soak benchmark: one worker under steady load for minutes, its memory sampled as it runs.

    .venv/bin/python -m bench.soak_bench [--duration-s 600] [--sample-s 10] [--model small|mid]
                                         [--connections 64] [--warmup-s 60] [--json out.json]
                                         [--worker-env SERVING_X=Y] [--worker-dir DIR]

One worker (`python -m serving.worker`, default settings: nothing is tuned) serves one
model built like the other benchmarks build theirs, one row per request, JSON tensors.
wrk (-t1) drives it closed-loop at a fixed concurrency in back-to-back chunks of
`--sample-s`; near the end of each chunk, while the load is still on, the worker's
memory is read from /proc/PID/status (VmRSS, RssAnon, threads) and /proc/PID/smaps_rollup
(Pss), with its open file descriptors. One row per chunk: elapsed s, RSS, anonymous
memory, req/s and non-200 answers in that chunk. Each chunk opens its connections anew,
so connection setup and teardown is part of what is soaked.

The verdict compares RSS at the end of the warm-up (the first sample at or after
`--warmup-s`) with the last sample, and fits a least-squares slope through the samples
after the warm-up. "Flat" means the growth over that period is under both FLAT_GROWTH_MIB
and FLAT_GROWTH_PCT. Bounded: a fixed duration, loopback only, and the worker is stopped
by its PID in a `finally`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from bench.overload_bench import prepare, wrk_statuses
from bench.serve_bench import (
    MODELS,
    WorkerProcess,
    add_common_arguments,
    apply_common_arguments,
    closed_loop,
)

FLAT_GROWTH_MIB = 10.0  # over the post-warm-up period; below both limits the RSS is "flat"
FLAT_GROWTH_PCT = 5.0
MEASURE_BEFORE_CHUNK_END_S = 0.5  # read memory this long before a chunk's load stops


@dataclass
class Memory:
    rss_mib: float
    anon_mib: float
    pss_mib: float
    threads: int
    open_fds: int


@dataclass
class Sample:
    elapsed_s: float
    memory: Memory
    seconds: float  # the chunk's length as the client measured it
    statuses: dict[int, int]
    socket_errors: int
    load_1m: float

    @property
    def req_s(self) -> float:
        return sum(self.statuses.values()) / self.seconds if self.seconds else float("nan")

    @property
    def non_200(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != 200)


@dataclass
class Verdict:
    warmup_s: float
    start_elapsed_s: float
    start_rss_mib: float
    end_rss_mib: float
    growth_mib: float
    growth_pct: float
    slope_mib_per_min: float
    flat: bool
    samples: int  # post-warm-up samples the slope is fitted through


# ---- memory ---------------------------------------------------------------------------


def read_memory(pid: int) -> Memory:
    """The process's memory now, from /proc (Linux); kB fields become MiB."""
    status_text = Path(f"/proc/{pid}/status").read_text()
    status = _kb_fields(status_text)
    try:
        pss_kb = _kb_fields(Path(f"/proc/{pid}/smaps_rollup").read_text()).get("Pss", float("nan"))
    except OSError:  # kernels before 4.14 have no smaps_rollup
        pss_kb = float("nan")
    threads = int(re.search(r"^Threads:\s+(\d+)", status_text, re.MULTILINE).group(1))
    return Memory(rss_mib=status["VmRSS"] / 1024, anon_mib=status.get("RssAnon", float("nan")) / 1024, pss_mib=pss_kb / 1024,
                  threads=threads, open_fds=len(os.listdir(f"/proc/{pid}/fd")))


def _kb_fields(text: str) -> dict[str, float]:
    return {name: float(kb) for name, kb in re.findall(r"^(\w+):\s+(\d+) kB$", text, re.MULTILINE)}


# ---- load -----------------------------------------------------------------------------


def load_chunk(args, port: int, path: str, body_file: Path, request: bytes) -> tuple[float, dict[int, int], int]:
    """One closed-loop chunk of `args.sample_s`: (seconds, answers by status, socket errors)."""
    if args.client == "wrk":
        seconds, counts, errors = wrk_statuses(port, path, body_file, args.connections, args.sample_s)
        return seconds, counts, sum(int(n) for n in re.findall(r"\d+", errors))
    result = asyncio.run(closed_loop(port, request, args.connections, args.sample_s))
    return result.seconds, {status: len(values) for status, values in result.latencies_s.items()}, 0


def soak(args, pid: int, port: int, path: str, body_file: Path, request: bytes) -> list[Sample]:
    """Back-to-back chunks until `args.duration_s`; memory read near each chunk's end, under load."""
    samples, started_s = [], time.monotonic()
    with ThreadPoolExecutor(1, thread_name_prefix="load") as pool:
        while time.monotonic() - started_s < args.duration_s:
            chunk = pool.submit(load_chunk, args, port, path, body_file, request)
            wait([chunk], timeout=max(args.sample_s - MEASURE_BEFORE_CHUNK_END_S, 0.1))
            memory, elapsed_s = read_memory(pid), time.monotonic() - started_s
            # wrk's own bound is its -d plus its 20 s request timeout
            seconds, statuses, socket_errors = chunk.result(timeout=args.sample_s + 60)
            sample = Sample(elapsed_s, memory, seconds, statuses, socket_errors, os.getloadavg()[0])
            samples.append(sample)
            print_row(sample)
    return samples


# ---- verdict and report ---------------------------------------------------------------


def verdict(samples: list[Sample], warmup_s: float) -> Verdict:
    """RSS at the warm-up's end vs the last sample, and the least-squares slope between."""
    after = [s for s in samples if s.elapsed_s >= warmup_s] or samples[-1:]
    start, end = after[0], after[-1]
    growth_mib = end.memory.rss_mib - start.memory.rss_mib
    growth_pct = 100 * growth_mib / start.memory.rss_mib
    return Verdict(warmup_s, start.elapsed_s, start.memory.rss_mib, end.memory.rss_mib, growth_mib, growth_pct,
                   60 * slope([s.elapsed_s for s in after], [s.memory.rss_mib for s in after]),
                   growth_mib < FLAT_GROWTH_MIB and growth_pct < FLAT_GROWTH_PCT, len(after))


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0 for fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0


def print_header() -> None:
    print("| elapsed s | RSS MiB | anon MiB | PSS MiB | threads | fds | req/s | non-200 | socket errors | load 1m |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)


def print_row(s: Sample) -> None:
    m = s.memory
    print(f"| {s.elapsed_s:.0f} | {m.rss_mib:.1f} | {m.anon_mib:.1f} | {m.pss_mib:.1f} | {m.threads} | {m.open_fds} | "
          f"{s.req_s:,.0f} | {s.non_200:,} | {s.socket_errors:,} | {s.load_1m:.2f} |", flush=True)


def print_verdict(samples: list[Sample], v: Verdict) -> None:
    statuses: dict[int, int] = {}
    for s in samples:
        for status, n in s.statuses.items():
            statuses[status] = statuses.get(status, 0) + n
    total = sum(statuses.values())
    seconds = sum(s.seconds for s in samples)
    print(f"\nanswers: {total:,} in {seconds:.0f} s of load ({total / seconds:,.0f} req/s), by status: "
          + ", ".join(f"{status}: {n:,}" for status, n in sorted(statuses.items()))
          + f"; non-200: {sum(n for status, n in statuses.items() if status != 200):,}; "
          f"socket errors: {sum(s.socket_errors for s in samples):,}")
    print(f"verdict: RSS {v.start_rss_mib:.1f} MiB at warm-up end ({v.start_elapsed_s:.1f} s) -> {v.end_rss_mib:.1f} MiB at the end "
          f"({samples[-1].elapsed_s:.1f} s): growth {v.growth_mib:+.1f} MiB ({v.growth_pct:+.1f}%), "
          f"slope {v.slope_mib_per_min:+.2f} MiB/min over {v.samples} post-warm-up samples; "
          f"{'FLAT' if v.flat else 'NOT FLAT'} (flat = growth < {FLAT_GROWTH_MIB:g} MiB and < {FLAT_GROWTH_PCT:g}%)")


# ---- the run --------------------------------------------------------------------------


def measure(args, workdir: Path) -> list[Sample]:
    setup = prepare(workdir, args.model)
    with WorkerProcess(setup.state_file, workdir / "cache") as worker:  # stopped by PID on any exit
        asyncio.run(closed_loop(worker.port, setup.request, 4, 1.0))  # warm connections and the latency model
        pid = worker.process.pid
        m = read_memory(pid)
        print(f"worker PID {pid}, ready and warmed: RSS {m.rss_mib:.1f} MiB, anon {m.anon_mib:.1f} MiB, "
              f"{m.threads} threads, {m.open_fds} fds\n")
        print_header()
        return soak(args, pid, worker.port, setup.path, setup.body_file, setup.request)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=600.0, help="seconds of load in all")
    parser.add_argument("--sample-s", type=int, default=10, help="seconds per load chunk; memory is read once per chunk")
    parser.add_argument("--warmup-s", type=float, default=60.0,
                        help="samples before this are warm-up (capped at half the duration)")
    parser.add_argument("--connections", type=int, default=64, help="closed-loop concurrency")
    parser.add_argument("--model", default="small", choices=tuple(MODELS))
    add_common_arguments(parser)
    args = parser.parse_args()
    apply_common_arguments(args)
    if args.sample_s < 1:
        parser.error("--sample-s must be at least 1")
    warmup_s = min(args.warmup_s, args.duration_s / 2)
    print(f"model {args.model} {MODELS[args.model]}, {os.cpu_count()} cores, client {args.client}, "
          f"{args.connections} connections, {args.duration_s:g} s in {args.sample_s} s chunks, warm-up {warmup_s:g} s, "
          f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="soak-bench-") as tmp:
        samples = measure(args, Path(tmp))
    result = verdict(samples, warmup_s)
    print_verdict(samples, result)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        report = {"model": args.model, "connections": args.connections, "client": args.client, "sample_s": args.sample_s,
                  "worker_env": WorkerProcess.extra_env, "worker_dir": str(WorkerProcess.source_dir),
                  "thresholds": {"growth_mib": FLAT_GROWTH_MIB, "growth_pct": FLAT_GROWTH_PCT},
                  "verdict": asdict(result),
                  "samples": [{**asdict(s), "req_s": s.req_s, "non_200": s.non_200} for s in samples]}
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


if __name__ == "__main__":
    main()
