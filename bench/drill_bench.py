"""Rollback drill benchmark: a live console, 4 workers under load, 20 drills.

    .venv/bin/python -m bench.drill_bench [--workers 4] [--drills 20]

Runs on a throwaway SQLite database and the Redis at REDIS_URL (or the embedded one).
Each drill rolls back and forward again; it reports how long after the operator's call
every worker acked and served the restored routes, and how many requests failed on the
workers meanwhile, while a client keeps sending requests to every worker.
Bounded: fixed counts, loopback only.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from console import embedded_redis
from tools.stack import REPO_ROOT, Stack

ROW = [0.0, 0.0, 5.0, 13.0, 9.0, 1.0, 0.0, 0.0] * 8


def manage(env: dict, *args: str) -> str:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env, check=True, capture_output=True, text=True).stdout


def prepare(env: dict) -> str:
    manage(env, "migrate", "--verbosity", "0")
    manage(env, "make_demo_models")
    manage(env, "ensure_login", "--username", "bench")
    return re.search(r"Generated token (\w+)", manage(env, "drf_create_token", "bench")).group(1)


def keep_loaded(workers, stop: threading.Event, statuses: Counter) -> None:
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            for worker in workers:
                try:
                    statuses[client.post(worker.url + "/predict", json={"model_name": "digits", "inputs": [ROW]}).status_code] += 1
                except httpx.HTTPError:
                    statuses["transport error"] += 1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(workers: int, drills: int, work_dir: str | None = None) -> None:
    with tempfile.TemporaryDirectory() as temporary:
        work = work_dir or temporary
        redis_process, redis_url = (None, os.environ["REDIS_URL"]) if os.environ.get("REDIS_URL") else embedded_redis.start(Path(work) / "redis")
        env = {**os.environ, "DATA_DIR": work, "REDIS_URL": redis_url, "SERVING_REPORT_INTERVAL_S": "1", "SERVING_DEVICE": "cpu",
               "DJANGO_SECRET_KEY": secrets.token_urlsafe(64), "SERVING_WORKER_TOKEN": "bench-token",
               "CHANNEL_LAYER_PREFIX": f"drill-bench-{os.getpid()}"}
        env.pop("DATABASE_URL", None)
        token = prepare(env)
        stack = Stack(env=env, work_dir=Path(work))
        try:
            stack.start_console()
            for _ in range(workers):
                stack.start_worker()
            measure(stack, token, drills)
        finally:
            stack.stop()
            if redis_process is not None:
                embedded_redis.stop(redis_process)


def measure(stack: Stack, token: str, drills: int) -> None:
    api = httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Token {token}"}, timeout=60)
    api.post("/api/models/digits/release/", json={"routes": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}).raise_for_status()
    time.sleep(2)
    stop, statuses = threading.Event(), Counter()
    loader = threading.Thread(target=keep_loaded, args=(stack.workers, stop, statuses))
    loader.start()
    results = []
    try:
        for _ in range(drills):
            results.append(api.post("/api/models/digits/drills/", json={"roll_forward": True}).json())
            time.sleep(0.5)
    finally:
        stop.set()
        loader.join()
    report(results, statuses, len(stack.workers))


def report(results: list[dict], statuses: Counter, workers: int) -> None:
    last_ack = [result["last_ack_s"] for result in results if result["last_ack_s"] is not None]
    confirmed = [result["confirmed_s"] for result in results if result["confirmed_s"] is not None]
    failed = sum(result["failed_requests"] or 0 for result in results)
    passed = sum(result["status"] == "passed" for result in results)
    split = [result for result in results if result.get("forward_unconfirmed")]
    print(f"\n{len(results)} drills, {workers} workers under load; client saw {dict(statuses)}")
    print("| measure | p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|")
    for name, values in (("call → last ack", last_ack), ("call → every worker confirmed serving", confirmed)):
        if values:
            print(f"| {name} | {percentile(values, 0.5) * 1000:.1f} | {percentile(values, 0.99) * 1000:.1f} | {max(values) * 1000:.1f} |")
    print(f"\nall acked: {len(last_ack)}/{len(results)}; passed: {passed}/{len(results)}; roll forward not followed by every worker: "
          f"{len(split)}/{len(results)}; failed requests during drills (worker-side 5xx): {failed}")
    for result in results:
        if result["status"] != "passed" or result.get("forward_unconfirmed"):
            print(f"drill {result['id']} {result['status']}: {result['error'] or result['workers']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--drills", type=int, default=20)
    parser.add_argument("--work-dir", help="keep the database and process logs here (an empty folder) instead of a temporary one")
    args = parser.parse_args()
    started = time.monotonic()
    run(args.workers, args.drills, args.work_dir)
    print(f"\nbench took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
