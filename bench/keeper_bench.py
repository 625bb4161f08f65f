"""The listen queue's keeper alone: how fast it refuses an open-loop flood, and how often it
refuses closed-loop clients that come straight back.

    .venv/bin/python -m bench.keeper_bench [--pairs 2] [--rate 8000] [--duration-s 6] [--before-dir DIR]

No worker: a stand-in loop takes connections from the listener at a fixed pace (300 a second
in the flood, 50 in the closed loop) and never answers, as an overloaded event loop would
not, so every answer a client gets is the keeper's 503. Two runs each round:

1. flood: `bench/open_loop_client.c` sends `--rate` requests a second, each past its first
   64 connections on a new connection, whatever the answers; latency counts from the
   scheduled time. The table gives the refusals' p50 / p95 / p99 and the share answered
   after more than 20 ms.
2. returning: 300 clients send a request each, and every client refused reconnects and sends
   again at once (wrk, most SDKs). The table gives how many 503s they got and when the last
   came: a keeper that spins them round refuses until the run ends.

`--before-dir DIR` runs the keeper of DIR/serving too (a worktree of another commit),
alternating with this checkout's, `--pairs` times.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REQUEST = b"POST /v2/models/m/infer HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
RETURNING_CLIENTS = textwrap.dedent("""
    import json, selectors, socket, sys, time
    port, count, seconds, request = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4].encode()
    waiting, refused_at = selectors.DefaultSelector(), []
    def connect():
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        client.sendall(request)
        waiting.register(client, selectors.EVENT_READ)
    start = time.monotonic()
    for _ in range(count):
        connect()
    while (now := time.monotonic()) < start + seconds:
        for key, _ in waiting.select(start + seconds - now):
            waiting.unregister(key.fileobj)
            key.fileobj.close()  # refused (a taken connection is never answered): back at once, as wrk and most SDKs do
            refused_at.append(time.monotonic() - start)
            connect()
    print(json.dumps(refused_at))
""")


class TakingLoop(threading.Thread):
    """A stand-in for the worker's event loop: takes a connection from the listener every
    ``pause_s``, holds it unanswered, and counts it in the keeper's shared page as the
    worker does."""

    def __init__(self, listener: socket.socket, keeper, pause_s: float = 0.0):
        super().__init__(daemon=True)
        self.listener, self.keeper, self.pause_s = listener, keeper, pause_s
        self.accepted: list[socket.socket] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        self.listener.settimeout(0.05)
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.keeper.accepted()
            self.accepted.append(connection)
            time.sleep(self.pause_s)

    def stop(self) -> None:
        self.stopping.set()
        self.join()
        for connection in self.accepted:
            connection.close()


def with_keeper(pause_s: float, drive) -> object:
    """A listener, its keeper (the worker's default accept wait and niceness) and a taking loop around ``drive(port)``."""
    # Here, not at the top: an arm imports the serving/ it was started with.
    from serving.config import ServingConfig
    from serving.listen_queue import Keeper

    defaults = ServingConfig()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4096)
        keeper = Keeper.start(listener, wait_s=defaults.accept_wait_s, log_level="error", nice=defaults.keeper_nice)
        loop = TakingLoop(listener, keeper, pause_s)
        loop.start()
        try:
            return drive(listener.getsockname()[1])
        finally:
            loop.stop()
            keeper.stop()


def flood(rate: float, duration_s: float) -> dict:
    from bench import native_client

    def drive(port: int) -> dict:
        result, _ = native_client.open_loop(port, REQUEST, rate, duration_s, 64)
        refusals_ms = np.array(result.latencies_s.get(503, [])) * 1000
        return {"refusals": len(refusals_ms), "p50_ms": float(np.percentile(refusals_ms, 50)),
                "p95_ms": float(np.percentile(refusals_ms, 95)), "p99_ms": float(np.percentile(refusals_ms, 99)),
                "over_20ms_pct": float((refusals_ms > 20).mean() * 100)}

    return with_keeper(1 / 300, drive)


def returning(duration_s: float) -> dict:
    def drive(port: int) -> dict:
        run = subprocess.run([sys.executable, "-c", RETURNING_CLIENTS, str(port), "300", str(duration_s), REQUEST.decode()],
                             capture_output=True, check=True, timeout=duration_s + 30)
        refused_at = json.loads(run.stdout)
        return {"refusals": len(refused_at), "last_refusal_s": max(refused_at, default=0.0)}

    return with_keeper(1 / 50, drive)


def run_arm(source_dir: Path, rate: float, duration_s: float) -> dict:
    """One round of both runs with the serving/ package of ``source_dir``, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(source_dir), str(ROOT)))}  # its serving/, this bench/
    run = subprocess.run([sys.executable, "-m", "bench.keeper_bench", "--arm", "--rate", str(rate), "--duration-s", str(duration_s)],
                         cwd=source_dir, env=env, capture_output=True, text=True, check=True, timeout=4 * duration_s + 120)
    return json.loads(run.stdout.strip().splitlines()[-1])


def print_table(rows: list[dict], rate: float, duration_s: float) -> None:
    print(f"\n| keeper | flood {rate:,.0f}/s: refusals | p50 / p95 / p99 ms | answered after 20 ms | "
          f"300 returning clients, {duration_s:g} s: 503s | last 503 at |")
    print("|---|---:|---|---:|---:|---:|")
    for row in rows:
        f, r = row["flood"], row["returning"]
        print(f"| {row['label']} | {f['refusals']:,} | {f['p50_ms']:.1f} / {f['p95_ms']:.1f} / {f['p99_ms']:.1f} | "
              f"{f['over_20ms_pct']:.1f} % | {r['refusals']:,} | {r['last_refusal_s']:.2f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--rate", type=float, default=8000.0, help="new connections a second in the flood")
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--before-dir", type=Path, help="also run DIR/serving's keeper, alternating")
    parser.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps({"flood": flood(args.rate, args.duration_s), "returning": returning(args.duration_s)}))
        return
    arms = [("this checkout", ROOT)] + ([("before", args.before_dir.resolve())] if args.before_dir else [])
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    rows = []
    for pair in range(args.pairs):
        for label, source_dir in arms:
            rows.append({"label": f"{label}, round {pair + 1}", **run_arm(source_dir, args.rate, args.duration_s)})
            print(f"  {rows[-1]['label']}: done", flush=True)
    print_table(rows, args.rate, args.duration_s)


if __name__ == "__main__":
    main()
