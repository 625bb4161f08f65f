"""Rollout benchmark: how soon the canary analysis rolls back a planted regression.

    .venv/bin/python -m bench.rollout_bench [--windows 1:20 2:50 5:100] [--rate 120]
        [--hot-share 0.1] [--failure-limit 2] [--work-dir DIR]

A live stack on a throwaway SQLite database and the Redis at REDIS_URL (or the embedded
one): the console (uvicorn), two `manage.py serve` workers reporting every 0.5 s, and a
Celery worker running beat with ROLLOUT_TICK_S 0.25. For every analysis setting
(`interval_s:min_requests`) and regression it registers a fresh model, stable v1 (an MLP
64 → 32 → 10) and a canary v2 with the regression planted
(`registry.building.onnx_build`), and starts a rollout `[50, 100]` under steady load
(`tools.traffic.SteadyLoad`: `--rate` requests a second over both workers, 8 rows each):

  5xx    `mlp_dropping_rows`: a request carrying a row whose feature 0 is above 5 gets
         500; `--hot-share` of the requests carry one
  shift  `mlp_favouring_class`: predicts class 3 for nearly every row, no errors, the
         same latency

Measured, on the client's clock (the console's timestamps are wall-clock on the same
machine): from the canary's first answer (the regression's first request) to the
rollback (the rollout's `finished_at`); the canary's answers meanwhile and how many were
not 200; the windows judged (and how many of them waited for data); and the time from
the moment the canary had answered `min_requests` requests to the rollback, in analysis
windows; and how many requests sent after the rollback the canary still answered (the
workers had not switched yet). Target: that last figure at most 2 windows (plus one beat tick, the analysis's
own granularity): "detected and rolled back within 2 analysis windows of reaching the
minimum request count".
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

from console import embedded_redis
from registry.building.onnx_build import (
    mlp_dropping_rows,
    mlp_favouring_class,
    random_mlp,
    to_bytes,
)
from tools.stack import Stack, upload_version, wait_until
from tools.traffic import SteadyLoad, request_bodies

SIZES = [64, 32, 10]
ROWS = 8
TICK_S = 0.25
REGRESSIONS = {
    "5xx": lambda seed: mlp_dropping_rows(SIZES, seed=seed, feature=0, above=5.0),
    "shift": lambda seed: mlp_favouring_class(SIZES, seed=seed, favoured=3, bias=8.0),
}


def start_stack(work: Path, redis_url: str) -> tuple[Stack, httpx.Client]:
    env = {**os.environ, "DATA_DIR": str(work / "data"), "REDIS_URL": redis_url, "DATABASE_URL": f"sqlite:///{work / 'bench.sqlite3'}",
           "DJANGO_SECRET_KEY": secrets.token_urlsafe(64), "SERVING_WORKER_TOKEN": "bench-token", "SERVING_DEVICE": "cpu",
           "SERVING_REPORT_INTERVAL_S": "0.5", "SERVING_MAX_BATCH_SIZE": "8", "ROLLOUT_TICK_S": str(TICK_S),
           "CHANNEL_LAYER_PREFIX": f"rollout-bench-{os.getpid()}"}
    stack = Stack(env=env, work_dir=work)
    stack.manage("migrate", "--verbosity", "0")
    token = stack.operator_token("bench")
    stack.start_console()
    stack.start_celery()
    for _ in range(2):
        stack.start_worker(wait_ready=False)
    return stack, httpx.Client(base_url=stack.console.url, headers={"Authorization": f"Token {token}"}, timeout=60)


def register(api: httpx.Client, stack: Stack, name: str, canary) -> None:
    api.post("/api/models/", json={"name": name}).raise_for_status()
    for model in (random_mlp(SIZES, seed=len(name)), canary):
        if upload_version(api, name, to_bytes(model))["status"] != "ready":  # validated by the stack's Celery worker
            raise RuntimeError(f"a version of {name} was rejected")
    probe = request_bodies(name, count=1)[0]
    for worker in stack.workers:
        if not wait_until(lambda worker=worker: httpx.post(worker.url + "/predict", content=probe, timeout=5).status_code == 200, 30, 0.1):
            raise RuntimeError(f"{worker.name} never served {name}")


def run_scenario(api: httpx.Client, stack: Stack, regression: str, interval_s: int, min_requests: int, failure_limit: int,
                 rate: float, hot_share: float) -> dict:
    name = f"{regression}-{interval_s}s-{min_requests}"
    register(api, stack, name, REGRESSIONS[regression](len(name)))
    analysis = {"interval_s": interval_s, "min_requests": min_requests, "failure_limit": failure_limit}
    bodies = request_bodies(name, rows=ROWS, hot_share=hot_share if regression == "5xx" else 0.0)
    with SteadyLoad([worker.url for worker in stack.workers], bodies, rate) as traffic:
        time.sleep(1.0)  # the load is steady before the canary gets any of it
        response = api.post(f"/api/models/{name}/rollouts/", json={"canary_version": 2, "steps": [50, 100], "step_duration_s": 3600,
                                                                    "analysis": analysis})
        response.raise_for_status()
        rollout_id = response.json()["id"]
        rollout = wait_until(lambda: finished(api, name, rollout_id), 30 * interval_s + 30, 0.1)
        time.sleep(1.0)  # answers still in flight at the rollback
    if rollout is None:
        raise RuntimeError(f"rollout {name} did not finish")
    return measure(rollout, traffic, interval_s, min_requests, failure_limit, regression)


def finished(api: httpx.Client, name: str, rollout_id: int) -> dict | None:
    rollout = api.get(f"/api/models/{name}/rollouts/{rollout_id}/").json()
    return rollout if rollout["status"] in {"promoted", "rolled_back", "aborted"} else None


def monotonic_of(stamp: str) -> float:
    """A console timestamp (ISO 8601, UTC) on this process's monotonic clock."""
    return datetime.fromisoformat(stamp).timestamp() - (time.time() - time.monotonic())


def measure(rollout: dict, traffic: SteadyLoad, interval_s: int, min_requests: int, failure_limit: int, regression: str) -> dict:
    rolled_back_at = monotonic_of(rollout["finished_at"])
    canary = sorted((answer for answer in traffic.answers() if answer.version == rollout["canary_version"]), key=lambda answer: answer.at)
    before = [answer for answer in canary if answer.sent < rolled_back_at]
    reached_at = before[min_requests - 1].at if len(before) >= min_requests else None
    since_reached_s = None if reached_at is None else rolled_back_at - reached_at
    return {
        "regression": regression, "interval_s": interval_s, "min_requests": min_requests, "failure_limit": failure_limit,
        "status": rollout["status"], "first_to_rollback_s": rolled_back_at - canary[0].sent if canary else None,
        "canary_answers": len(before), "canary_failed": sum(answer.status != 200 for answer in before),
        "windows": rollout["windows_judged"], "waiting": sum(verdict["result"] == "waiting_for_data" for verdict in rollout["verdicts"]),
        "since_reached_windows": None if since_reached_s is None else since_reached_s / interval_s,
        "met": rollout["status"] == "rolled_back" and since_reached_s is not None and since_reached_s <= 2 * interval_s + TICK_S,
        "canary_after": len(canary) - len(before), "reason": rollout["status_reason"],
    }


def report(results: list[dict], rate: float, hot_share: float) -> None:
    print(f"\nsteady load {rate:g} req/s ({ROWS} rows each) over 2 workers; canary at 50 %; beat tick {TICK_S} s; "
          f"5xx: {hot_share:.0%} of requests trip the regression")
    print("| regression | interval s | min_requests | failure_limit | first canary request → rollback s | canary answers (not 200) "
          "| windows judged (waiting) | min_requests reached → rollback, windows | target met | canary answers sent after the rollback |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for row in results:
        print(f"| {row['regression']} | {row['interval_s']} | {row['min_requests']} | {row['failure_limit']} | {_number(row['first_to_rollback_s'], 2)} "
              f"| {row['canary_answers']} ({row['canary_failed']}) | {row['windows']} ({row['waiting']}) | {_number(row['since_reached_windows'], 2)} "
              f"| {'yes' if row['met'] else 'NO (' + row['status'] + ')'} | {row['canary_after']} |")
    print()
    for row in results:
        print(f"{row['regression']} {row['interval_s']} s / {row['min_requests']}: {row['reason']}")


def _number(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", nargs="+", default=["1:20", "2:50", "5:100"], metavar="INTERVAL_S:MIN_REQUESTS")
    parser.add_argument("--regressions", nargs="+", default=list(REGRESSIONS), choices=tuple(REGRESSIONS))
    parser.add_argument("--rate", type=float, default=120.0, help="requests a second over both workers")
    parser.add_argument("--hot-share", type=float, default=0.1, help="share of requests that trip the 5xx regression")
    parser.add_argument("--failure-limit", type=int, default=2)
    parser.add_argument("--work-dir", help="keep the database and process logs here (an empty folder) instead of a temporary one")
    args = parser.parse_args()
    started = time.monotonic()
    print(f"{os.cpu_count()} cores, load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(args.work_dir or temporary)
        redis_process, redis_url = (None, os.environ["REDIS_URL"]) if os.environ.get("REDIS_URL") else embedded_redis.start(work / "redis")
        stack, api = start_stack(work, redis_url)
        try:
            results = []
            for window in args.windows:
                interval_s, min_requests = (int(part) for part in window.split(":"))
                for regression in args.regressions:
                    results.append(run_scenario(api, stack, regression, interval_s, min_requests, args.failure_limit, args.rate, args.hot_share))
        finally:
            api.close()
            stack.stop()
            if redis_process is not None:
                embedded_redis.stop(redis_process)
    report(results, args.rate, args.hot_share)
    print(f"\nbench took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
