"""Overload benchmark: goodput, deadlines and rejection times far past capacity.

    .venv/bin/python -m bench.overload_bench [--duration-s 8] [--model small|mid] [--json out.json]
                                             [--worker-env SERVING_X=Y] [--worker-dir DIR] [--pin-worker-cpu N]

One worker (`python -m serving.worker`, default settings: nothing is tuned) serves one
model built by `registry.building.onnx_build`, one row per request, JSON tensors. The runs:

1. capacity: closed loop at 64 connections (wrk -t1, else the asyncio client);
2. closed loop at 256 and 2,048 connections (wrk); a probe on its own keep-alive
   connections sends a few requests a second meanwhile and records each answer's status
   and latency, since wrk's latency histogram mixes 200s with 503s;
3. open loop at 3x capacity (bench/open_loop_client.c where a C compiler is, else the asyncio
   client: requests leave on schedule whatever the answers; latency counts from the
   scheduled time, so client-side queueing is included).

Goodput is 200s per second (over the whole run, the drain included); "kept deadline" is the share of 200s answered within the
worker's request timeout (SERVING_REQUEST_TIMEOUT_S, 10 s by default). The table prints
goodput as a share of the capacity measured in the same run: the machine is shared. The
CPU columns are the worker's, the load generator's and the worker's listen-queue keeper's
(serving/listen_queue.py, a child process of the worker).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import orjson
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from bench import native_client
from bench.serve_bench import (
    MODELS,
    LoadResult,
    WorkerProcess,
    add_common_arguments,
    apply_common_arguments,
    closed_loop,
    http_request,
    infer_body,
    read_answer,
    write_models,
)
from serving.contract import DesiredState, ModelState, Route

DEADLINE_S = 10.0  # the worker's default request timeout


def state_with_defaults(models: dict, name: str) -> dict:
    """The model at 100%, with no batching override: the worker's defaults apply."""
    path, sha = models[name]
    route = Route(version=1, weight=100, sha256=sha, artifact_url=str(path), signature={"batchable": True})
    return DesiredState(generation=1, models={name: ModelState(routes=(route,))}).to_dict()


def wrk_statuses(port: int, path: str, body_file: Path, connections: int, duration_s: float) -> tuple[float, dict[int, int], str]:
    """wrk closed loop; per-status counts from a Lua `response` hook."""
    script = body_file.with_suffix(".status.lua")
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f'local f = io.open("{body_file}", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
        "counts = {}\nlocal threads = {}\n"
        "function setup(thread) table.insert(threads, thread) end\n"
        "function response(status, headers, body) counts[status] = (counts[status] or 0) + 1 end\n"
        "function done(summary, latency, requests)\n"
        "  for _, thread in ipairs(threads) do\n"
        "    for status, n in pairs(thread:get('counts')) do io.write(string.format('status %d %d\\n', status, n)) end\n"
        "  end\n"
        "  io.write(string.format('errors connect %d read %d write %d timeout %d\\n', summary.errors.connect,\n"
        "    summary.errors.read, summary.errors.write, summary.errors.timeout))\n"
        "end\n"
    )
    output = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration_s))}s", "--timeout", "20s", "-s", str(script),
         f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True, check=True,
    ).stdout
    seconds = wrk_seconds(output)
    counts = {int(status): int(n) for status, n in re.findall(r"^status (\d+) (\d+)$", output, re.MULTILINE)}
    errors = re.search(r"^errors .*$", output, re.MULTILINE).group(0)
    return seconds, counts, errors


def wrk_seconds(output: str) -> float:
    """wrk's "N requests in 59.99s" (or "1.00m", "1.00h" past a minute)."""
    value, unit = re.search(r"requests in ([\d.]+)(s|m|h)", output).groups()
    return float(value) * {"s": 1, "m": 60, "h": 3600}[unit]


class Probe:
    """A few requests a second on keep-alive connections opened before the load starts."""

    def __init__(self, port: int, path: str, body: bytes, rate_per_s: float = 20.0, connections: int = 8):
        self.url, self.body, self.interval_s = f"http://127.0.0.1:{port}{path}", body, 1.0 / rate_per_s
        self.client = httpx.Client(timeout=30.0, limits=httpx.Limits(max_keepalive_connections=connections))
        self.result = LoadResult(0.0)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(index, connections), daemon=True) for index in range(connections)]
        for _ in range(2):  # open the connections while the worker is idle
            self.client.post(self.url, content=self.body, headers={"Content-Type": "application/json"})

    def __enter__(self) -> Probe:
        self._started_s = time.perf_counter()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=40)
        self.result.seconds = time.perf_counter() - self._started_s
        self.client.close()

    def _run(self, index: int, connections: int) -> None:
        next_s = time.perf_counter() + index * self.interval_s
        while not self._stop.is_set():
            time.sleep(max(next_s - time.perf_counter(), 0.0))
            started_s = time.perf_counter()
            try:
                status = self.client.post(self.url, content=self.body, headers={"Content-Type": "application/json"}).status_code
            except httpx.HTTPError:
                status = 0
            self.result.add(status, time.perf_counter() - started_s)
            next_s += connections * self.interval_s


async def open_loop(port: int, request: bytes, rate_per_s: float, duration_s: float, connections: int,
                    max_connections: int = 6000) -> LoadResult:
    """Requests at a fixed rate whatever the answers, on `connections` keep-alive
    connections; a request finding none free opens its own (as a new client would), up
    to `max_connections`, beyond which it is status 0 (a client-side drop, so the offered
    rate stays honest). Like any HTTP client, it does not reuse a connection the server
    answered `Connection: close` on or closed while idle (uvicorn's keep-alive timeout);
    a request whose connection fails to open or breaks while in flight is status -1."""
    result, free = LoadResult(duration_s), asyncio.Queue()
    for _ in range(connections):
        free.put_nowait(await _connect(port))

    async def one(connection, scheduled_s: float) -> None:
        reader, writer = connection
        if reader is None or reader.at_eof():  # closed while idle, or after a `Connection: close` answer
            writer is not None and writer.close()
            reader, writer = connection = await _connect(port)
        keep_alive = False
        try:
            if reader is None:
                raise ConnectionError("could not connect")
            result.send_lags_s.append(time.perf_counter() - scheduled_s)
            writer.write(request)
            status, keep_alive = await read_answer(reader)
        except (ConnectionError, RuntimeError, asyncio.IncompleteReadError):
            status = -1
        if not keep_alive:
            writer is not None and writer.close()
            connection = (None, None)  # the next request on this slot opens a new connection
        result.add(status, time.perf_counter() - scheduled_s)
        free.put_nowait(connection)

    async def one_new(scheduled_s: float) -> None:
        await one(await _connect(port), scheduled_s)

    tasks, interval_s, started_s, opened = [], 1.0 / rate_per_s, time.perf_counter(), connections
    for index in range(int(rate_per_s * duration_s)):
        scheduled_s = started_s + index * interval_s
        delay_s = scheduled_s - time.perf_counter()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        if not free.empty():
            tasks.append(asyncio.ensure_future(one(free.get_nowait(), scheduled_s)))
        elif opened < max_connections:  # a new client arrives with its own connection
            opened += 1
            tasks.append(asyncio.ensure_future(one_new(scheduled_s)))
        else:
            result.add(0, 0.0)
    await asyncio.gather(*tasks)
    result.seconds = time.perf_counter() - started_s
    for reader, writer in [free.get_nowait() for _ in range(free.qsize())]:
        writer is not None and writer.close()
    return result


async def _connect(port: int):
    try:
        return await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None, None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds(pid: int) -> float:
    """CPU time of a process's live children (the worker's listen-queue keeper)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    total = 0.0
    for child in children:
        try:
            total += cpu_seconds(int(child))
        except OSError:  # it ended meanwhile
            pass
    return total


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of a process onto ``cpus`` (sched_setaffinity moves one thread)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def pin_apart(worker_pid: int, worker_cpu: int) -> None:
    """The worker alone on one core; its keeper and the load generator (this process and
    the clients it starts from now on) on the others: what the worker keeps when nothing
    else takes its core, as on a server whose clients are other machines."""
    others = set(range(os.cpu_count() or 1)) - {worker_cpu}
    pin(worker_pid, {worker_cpu})
    for child in Path(f"/proc/{worker_pid}/task/{worker_pid}/children").read_text().split():
        pin(int(child), others)
    pin(os.getpid(), others)


def generator_cpu_seconds() -> float:
    """CPU time of the load generator: this process (the asyncio clients and the probe)
    and its finished children (wrk)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class CpuMeter:
    """The worker's and the load generator's CPU cores in use over a run, so a run where
    the generator took the cores can be told from one where the worker wasted them."""

    def __init__(self, pid: int):
        self.pid = pid

    def __enter__(self) -> CpuMeter:
        self._cpu_s, self._generator_s, self._wall_s = cpu_seconds(self.pid), generator_cpu_seconds(), time.perf_counter()
        self._children_s = children_cpu_seconds(self.pid)
        return self

    def __exit__(self, *exc) -> None:
        wall_s = time.perf_counter() - self._wall_s
        self.cpu_s = cpu_seconds(self.pid) - self._cpu_s
        self.cores = self.cpu_s / wall_s
        self.generator_cores = (generator_cpu_seconds() - self._generator_s) / wall_s
        self.keeper_cores = (children_cpu_seconds(self.pid) - self._children_s) / wall_s


class Refusals:
    """Who answered the 503s of a run, from the worker's /metrics before and after: the
    listen queue's keeper, the worker's connection cap, or the worker's admission (a
    request refused by its version's queue or deadline)."""

    def __init__(self, port: int):
        self.port = port

    def __enter__(self) -> Refusals:
        self._before = self._scrape()
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.3)  # the worker folds the keeper's count in on its 0.1 s tick
        after = self._scrape()
        self.by = {who: after[who] - self._before[who] for who in after}

    def summary(self) -> str:
        return ("503s by who answered: keeper {keeper:,.0f}, worker's connection cap {worker:,.0f}, "
                "worker's admission {admission:,.0f}").format(**self.by)

    def _scrape(self) -> dict[str, float]:
        counts = {"keeper": 0.0, "worker": 0.0, "admission": 0.0}
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", headers={"Connection": "close"}, timeout=30).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "modelops_connections_refused_total":
                    counts[sample.labels["by"]] += sample.value
                elif sample.name == "modelops_requests_total" and sample.labels.get("code") == "503":
                    counts["admission"] += sample.value
        return counts


def row(run: str, offered: str, seconds: float, counts: dict[int, int], capacity: float, probe: LoadResult | None, note: str = "",
        cpu: CpuMeter | None = None) -> dict:
    ok = counts.get(200, 0)
    latencies = probe.latencies_s if probe is not None else {}
    accepted = latencies.get(200, [])
    rejected = [value for status, values in latencies.items() if status != 200 for value in values]
    return {
        "run": run, "offered": offered, "goodput_req_s": ok / seconds, "pct_capacity": 100 * ok / seconds / capacity if capacity else float("nan"),
        "statuses": {str(status): n for status, n in sorted(counts.items())},
        "accepted_p50_ms": _ms(accepted, 50), "accepted_p99_ms": _ms(accepted, 99), "accepted_max_ms": _ms(accepted, 100),
        "kept_deadline_pct": 100 * sum(value <= DEADLINE_S for value in accepted) / len(accepted) if accepted else float("nan"),
        "rejected_p50_ms": _ms(rejected, 50), "rejected_p99_ms": _ms(rejected, 99), "samples": sum(len(v) for v in latencies.values()),
        "worker_cores": cpu.cores if cpu else float("nan"), "ok_per_cpu_s": ok / cpu.cpu_s if cpu and cpu.cpu_s else float("nan"),
        "generator_cores": cpu.generator_cores if cpu else float("nan"),
        "keeper_cores": cpu.keeper_cores if cpu else float("nan"),
        "note": note,
    }


def _ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000) if values else float("nan")


def print_table(rows: list[dict]) -> None:
    """The last two columns tell where a shortfall goes: a worker as efficient as at
    capacity (200s per CPU-second near 100 % of capacity's) that got fewer cores lost
    them to the load generator, which shares the machine."""
    print("| run | offered | goodput req/s | % of capacity | answers by status | accepted p50 / p99 / max ms | within deadline | "
          "rejected p50 / p99 ms | latency samples | worker CPU cores | 200s per worker CPU-s | % of capacity's | generator CPU cores | "
          "keeper CPU cores |")
    print("|---|---|---:|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    efficiency = rows[0]["ok_per_cpu_s"] if rows else float("nan")
    for r in rows:
        statuses = ", ".join(f"{status}: {n:,}" for status, n in r["statuses"].items())
        print(f"| {r['run']} | {r['offered']} | {r['goodput_req_s']:,.0f} | {r['pct_capacity']:.0f}% | {statuses} | "
              f"{r['accepted_p50_ms']:.1f} / {r['accepted_p99_ms']:.1f} / {r['accepted_max_ms']:.1f} | {r['kept_deadline_pct']:.1f}% | "
              f"{r['rejected_p50_ms']:.1f} / {r['rejected_p99_ms']:.1f} | {r['samples']:,} | {r['worker_cores']:.2f} | {r['ok_per_cpu_s']:,.0f} | "
              f"{100 * r['ok_per_cpu_s'] / efficiency:.0f}% | {r['generator_cores']:.2f} | {r.get('keeper_cores', float('nan')):.2f} |")
    for r in rows:
        if r["note"]:
            print(f"  {r['run']}: {r['note']}")


@dataclass(frozen=True)
class Setup:
    """One model's files for a single-worker run: its state file (defaults), a one-row
    request body on disk (for wrk) and the same request as raw HTTP (for asyncio clients)."""

    state_file: Path
    body: bytes
    body_file: Path
    path: str
    request: bytes


def prepare(workdir: Path, model: str) -> Setup:
    models = write_models(workdir)
    state_file = workdir / "state.json"
    state_file.write_bytes(orjson.dumps(state_with_defaults(models, model)))
    body = infer_body(MODELS[model][0])
    body_file = workdir / "body.json"
    body_file.write_bytes(body)
    path = f"/v2/models/{model}/infer"
    return Setup(state_file, body, body_file, path, http_request(path, body))


def measure(args, workdir: Path) -> list[dict]:
    setup = prepare(workdir, args.model)
    state_file, body, body_file, path, request = setup.state_file, setup.body, setup.body_file, setup.path, setup.request
    rows = []
    with WorkerProcess(state_file, workdir / "cache") as worker:
        asyncio.run(closed_loop(worker.port, request, 4, 1.0))  # warm connections and the latency model
        pid = worker.process.pid
        if args.pin_worker_cpu is not None:
            pin_apart(pid, args.pin_worker_cpu)
        with CpuMeter(pid) as cpu:
            if args.client == "wrk":
                seconds, counts, errors = wrk_statuses(worker.port, path, body_file, 64, args.duration_s)
            else:
                result = asyncio.run(closed_loop(worker.port, request, 64, args.duration_s))
                seconds, counts, errors = result.seconds, {s: len(v) for s, v in result.latencies_s.items()}, ""
        capacity = counts.get(200, 0) / seconds
        rows.append(row("capacity", "closed loop, 64 connections", seconds, counts, capacity, None, errors, cpu))
        if args.client == "wrk":
            for connections in (256, 2048):
                with Refusals(worker.port) as refusals, Probe(worker.port, path, body) as probe, CpuMeter(pid) as cpu:
                    seconds, counts, errors = wrk_statuses(worker.port, path, body_file, connections, args.duration_s)
                rows.append(row(f"{connections:,} connections", f"closed loop, {connections:,} connections", seconds, counts, capacity,
                                probe.result, "; ".join(filter(None, (errors, refusals.summary()))), cpu))
        offered = 3 * capacity
        with Refusals(worker.port) as refusals, CpuMeter(pid) as cpu:
            if args.open_loop_client == "native":
                result, summary = native_client.open_loop(worker.port, request, offered, args.duration_s, args.open_connections)
            else:  # uvloop: the generator shares the worker's cores, so the less CPU it needs the better
                result = uvloop.run(open_loop(worker.port, request, offered, args.duration_s, connections=args.open_connections))
                summary = ""
        counts = {status: len(values) for status, values in result.latencies_s.items()}
        drops = counts.pop(0, 0)
        result.latencies_s.pop(0, None)
        sent = sum(counts.values())
        note = (f"{sent / args.duration_s:,.0f} req/s actually sent; {drops:,} found no free client connection (not sent); "
                f"send lag p50 / p99 {_ms(result.send_lags_s, 50):.1f} / {_ms(result.send_lags_s, 99):.1f} ms "
                "(scheduled time to write, connecting included: the client's own delay, inside every latency above)"
                + (f"; C client: {summary}" if summary else "") + f"; {refusals.summary()}")
        rows.append(row("3x capacity", f"open loop, {offered:,.0f} req/s", result.seconds, counts, capacity, result, note, cpu))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=8.0)
    parser.add_argument("--model", default="small", choices=tuple(MODELS))
    parser.add_argument("--open-connections", type=int, default=512, help="keep-alive client connections the open-loop run starts with")
    parser.add_argument("--open-loop-client", choices=("native", "asyncio"), default="native" if native_client.available() else "asyncio",
                        help="the open-loop generator: C (bench/open_loop_client.c, built with the machine's compiler) or asyncio")
    parser.add_argument("--pin-worker-cpu", type=int, help="run the worker alone on this core, everything else on the others")
    add_common_arguments(parser)
    args = parser.parse_args()
    apply_common_arguments(args)
    print(f"model {args.model} {MODELS[args.model]}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
          f"client {args.client}, open loop {args.open_loop_client}")
    with tempfile.TemporaryDirectory(prefix="overload-bench-") as tmp:
        rows = measure(args, Path(tmp))
    print_table(rows)
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
