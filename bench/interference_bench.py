"""How much of a worker's capacity a connection flood takes when the worker never sees it.

    .venv/bin/python -m bench.interference_bench [--model small|mid] [--duration-s 6] [--rounds 2]
                                                 [--flood-factor 2] [--worker-env SERVING_X=Y] [--worker-dir DIR]

Why: in the open-loop run of `bench.overload_bench` (3x capacity) about two thirds of the
requests are refused as new connections, and on a machine where the load generator shares
the worker's cores, the generator's sending, the refusals and the kernel's loopback work
all take CPU the worker would serve with. This run separates that share from anything the
worker does: the worker is driven at capacity (wrk, closed loop, 64 connections), alone and
then while the same C generator (bench/open_loop_client.c) sends `--flood-factor` times the
worker's capacity in new connections to *another* port, where a listen-queue keeper
(serving/listen_queue.py, the worker's own refusal path and niceness) answers every one 503
and nothing accepts them. Alone and flooded alternate, `--rounds` times each. What a flooded
round keeps of the alone rounds' goodput is what this machine leaves a perfect worker, one
that spends nothing at all on the connections it refuses.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import native_client
from bench.overload_bench import CpuMeter, cpu_seconds, prepare, wrk_statuses
from bench.serve_bench import MODELS, ROOT, WorkerProcess, closed_loop
from serving.config import ServingConfig
from serving.listen_queue import ACCEPTED, Keeper

FLOOD_KEEP_ALIVE = 64  # the flood's connections opened before it starts; every request past them is a new connection


@dataclass(frozen=True)
class FloodFigures:
    sent_per_s: float = 0.0
    client_cores: float = 0.0
    keeper_cores: float = 0.0
    refused_share: float = 0.0  # of the requests sent, those answered 503 (the rest: reset or unanswered)


@dataclass(frozen=True)
class Round:
    flooded: bool
    goodput_req_s: float
    worker_cores: float
    ok_per_cpu_s: float
    flood: FloodFigures = FloodFigures()


class Flood:
    """New connections to a port where a keeper refuses each one (the only connection slot
    counts as taken, so its room is zero) and nothing accepts; stopped by closing it."""

    def __init__(self, rate_per_s: float, duration_s: float, request: bytes, workdir: Path):
        self.sink = socket.create_server(("127.0.0.1", 0), backlog=4096)
        self.keeper = Keeper.start(self.sink, wait_s=5.0, log_level="error", max_connections=1,
                                   nice=ServingConfig().keeper_nice)  # the default worker keeper's
        if self.keeper is None:
            raise RuntimeError("no listen-queue keeper on this platform (Linux only)")
        self.keeper.counters[ACCEPTED] = 1
        request_file, self.out_file = workdir / "flood-request.http", workdir / "flood-records.bin"
        request_file.write_bytes(request)
        port = self.sink.getsockname()[1]
        self.client = subprocess.Popen(
            native_client.command(port, rate_per_s, duration_s, FLOOD_KEEP_ALIVE, 6000, request_file, self.out_file),
            stdout=subprocess.DEVNULL)
        self.started_s = time.perf_counter()
        self._client_s, self._keeper_s = self._cpu()

    def _cpu(self) -> tuple[float, float]:
        return cpu_seconds(self.client.pid), cpu_seconds(self.keeper.process.pid)

    def stop(self, duration_s: float) -> FloodFigures:
        """Ends the flood; its figures over the flood so far."""
        wall_s = time.perf_counter() - self.started_s
        client_s, keeper_s = self._cpu()
        self.keeper.stop()
        self.sink.close()  # what is still queued is reset; requests still scheduled meet a closed port
        self.client.wait(timeout=duration_s + 60)
        statuses = np.fromfile(self.out_file, dtype=native_client.RECORD)["status"]
        sent = statuses[statuses != 0]  # 0: found no free connection slot, never sent
        return FloodFigures(len(sent) / duration_s, (client_s - self._client_s) / wall_s, (keeper_s - self._keeper_s) / wall_s,
                            float(np.mean(sent == 503)) if len(sent) else 0.0)


def measure(args, workdir: Path) -> list[Round]:
    setup = prepare(workdir, args.model)
    rounds = []
    with WorkerProcess(setup.state_file, workdir / "cache") as worker:
        asyncio.run(closed_loop(worker.port, setup.request, 4, 1.0))  # warm connections and the latency model
        capacity = None
        for flooded in [False, True] * args.rounds:
            flood = None
            if flooded:
                flood = Flood(args.flood_factor * capacity, args.duration_s, setup.request, workdir)
            try:
                with CpuMeter(worker.process.pid) as cpu:
                    seconds, counts, _ = wrk_statuses(worker.port, setup.path, setup.body_file, 64, args.duration_s)
            finally:
                figures = flood.stop(args.duration_s) if flood is not None else FloodFigures()
            ok = counts.get(200, 0)
            result = Round(flooded, ok / seconds, cpu.cores, ok / cpu.cpu_s if cpu.cpu_s else float("nan"), figures)
            if not flooded and capacity is None:
                capacity = result.goodput_req_s
            rounds.append(result)
    return rounds


def report(args, rounds: list[Round]) -> None:
    alone = [r for r in rounds if not r.flooded]
    base_goodput = sum(r.goodput_req_s for r in alone) / len(alone)
    base_efficiency = sum(r.ok_per_cpu_s for r in alone) / len(alone)
    print(f"model {args.model} {MODELS[args.model]}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"flood {args.flood_factor:g}x capacity in new connections to another port")
    print("| round | flood sent req/s | of it answered 503 | worker goodput req/s | % of alone rounds' mean | worker CPU cores | "
          "200s per worker CPU-s | % of alone | flood client cores | flood keeper cores | keeper µs a refusal |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rounds:
        f = r.flood
        print(f"| {'flooded' if r.flooded else 'alone'} | {f.sent_per_s:,.0f} | {100 * f.refused_share:.1f}% | {r.goodput_req_s:,.0f} | "
              f"{100 * r.goodput_req_s / base_goodput:.0f}% | {r.worker_cores:.2f} | {r.ok_per_cpu_s:,.0f} | "
              f"{100 * r.ok_per_cpu_s / base_efficiency:.0f}% | {f.client_cores:.2f} | {f.keeper_cores:.2f} | "
              f"{f'{1e6 * f.keeper_cores / f.sent_per_s:.0f}' if f.sent_per_s else '–'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2, help="alone and flooded rounds, alternating, this many of each")
    parser.add_argument("--flood-factor", type=float, default=2.0,
                        help="new connections per second to the other port, as a multiple of the first alone round's goodput "
                             "(2: what the 3x open-loop run refuses)")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a SERVING_* setting for the worker under test (repeatable)")
    parser.add_argument("--worker-dir", type=Path, default=ROOT, help="directory holding the serving/ package to run")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        parser.error("this benchmark drives the worker with wrk: install it (apt-get install wrk)")
    WorkerProcess.extra_env = dict(item.split("=", 1) for item in args.worker_env)
    WorkerProcess.source_dir = args.worker_dir.resolve()
    with tempfile.TemporaryDirectory(prefix="interference-bench-") as tmp:
        report(args, measure(args, Path(tmp)))


if __name__ == "__main__":
    main()
