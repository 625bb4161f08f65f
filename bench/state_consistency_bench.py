"""State consistency benchmark: is every `GET /api/serving/state` its generation's truth?

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME \\
        .venv/bin/python -m bench.state_consistency_bench [--writers 4] [--readers 4] [--duration-s 20]
                                                          [--console-port PORT] [--work-dir DIR] [--allow-sqlite]

Issue #9, item 1 (docs/reliability.md §1): the state was once read as each model's
release and the global generation in separate queries, and under steady changes 40 of
866 reads answered generation N with the routes of N-1. This runs the console as
drill_bench does (uvicorn, `tools.stack.Stack`) on the PostgreSQL database of
``DATABASE_URL`` (``--database-url``), migrated and given the demo model `digits` here:
use a throwaway database, the run appends releases to it (to run on it again, give the
same ``--work-dir``: the versions' artifacts are stored there). SQLite is refused unless
``--allow-sqlite`` (its writers are serialised by a file lock, so it is a weaker test,
and the output says so). Redis: REDIS_URL, or the embedded one.

For ``--duration-s`` seconds, ``--writers`` threads make real traffic changes to
`digits` through the REST API as an operator's token (a split between two ready
versions, a promote, a rollback; a 409 when the action does not apply is counted, not
retried), while ``--readers`` threads read `GET /api/serving/state` with the worker
token (Bearer, as `manage.py serve` does) as fast as they can. Afterwards every state
read is checked independently of `registry/fleet/state.py`:

- torn: for every model, its routes (and its entry's generation) must be those of the
  newest release at or below the state's generation in the model's release history
  (`GET /api/models/{name}/releases/`, every page), and a model whose newest such
  release archived it, or that had none, must be absent;
- digest: `serving.state_signing.state_digest` of the state as received must be the
  `digest` it carries.

Prints a table; exits 1 if any state read was torn or its digest did not match, 2 if
the run proved nothing (no successful read or no change made). Loopback only, bounded by
``--duration-s`` plus start-up; the console is stopped by PID (``Stack.stop``).
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.drill_bench import percentile, prepare
from console import embedded_redis
from serving.state_signing import state_digest
from tools.stack import Stack

MODEL = "digits"
WORKER_TOKEN = "state-bench-token"
ACTIONS = ("split", "split", "promote", "rollback")  # a split half the time: promote and rollback need one to act on
MAX_EXAMPLES = 5


def database_url(given: str | None, allow_sqlite: bool) -> str:
    url = given or os.environ.get("DATABASE_URL", "")
    if not url:
        sys.exit("give the PostgreSQL database to use: --database-url or DATABASE_URL (a throwaway one: releases are appended to it)")
    if url.startswith("sqlite") and not allow_sqlite:
        sys.exit("refusing SQLite (writers are serialised by its file lock, so the race is hardly exercised); --allow-sqlite to run anyway")
    return url


def run(url: str, writers: int, readers: int, duration_s: float, console_port: int | None, work_dir: str | None) -> int:
    with tempfile.TemporaryDirectory() as temporary:
        work = work_dir or temporary
        redis_process, redis_url = (None, os.environ["REDIS_URL"]) if os.environ.get("REDIS_URL") else embedded_redis.start(Path(work) / "redis")
        env = {**os.environ, "DATABASE_URL": url, "DATA_DIR": work, "REDIS_URL": redis_url, "SERVING_DEVICE": "cpu",
               "DJANGO_SECRET_KEY": secrets.token_urlsafe(64), "SERVING_WORKER_TOKEN": WORKER_TOKEN,
               "CHANNEL_LAYER_PREFIX": f"state-bench-{os.getpid()}"}
        token = prepare(env)
        stack = Stack(env=env, work_dir=Path(work))
        try:
            stack.start_console(port=console_port)
            return measure(stack.console.url, token, writers, readers, duration_s, sqlite=url.startswith("sqlite"))
        finally:
            stack.stop()
            if redis_process is not None:
                embedded_redis.stop(redis_process)


class Writer(threading.Thread):
    """Traffic changes on `digits`, one after another, until the deadline."""

    def __init__(self, base_url: str, token: str, versions: list[int], deadline: float, seed: int):
        super().__init__(daemon=True)
        self.base_url, self.token, self.versions, self.deadline = base_url, token, versions, deadline
        self.random = random.Random(seed)
        self.made: Counter = Counter()  # action → 201s
        self.other: Counter = Counter()  # (action, status) → count, anything but a 201

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, headers={"Authorization": f"Token {self.token}"}, timeout=30) as api:
            while time.monotonic() < self.deadline:
                action = self.random.choice(ACTIONS)
                try:
                    status = self.act(api, action)
                except httpx.HTTPError as error:
                    status = type(error).__name__
                if status == 201:
                    self.made[action] += 1
                else:
                    self.other[(action, status)] += 1

    def act(self, api: httpx.Client, action: str) -> int:
        body = {"reason": "state consistency bench"}
        if action == "split":
            stable, canary = self.random.sample(self.versions, 2)
            weight = self.random.randint(1, 50)
            body["routes"] = [{"version": stable, "weight": 100 - weight}, {"version": canary, "weight": weight}]
            return api.post(f"/api/models/{MODEL}/release/", json=body).status_code
        return api.post(f"/api/models/{MODEL}/release/{action}/", json=body).status_code


class Reader(threading.Thread):
    """`GET /api/serving/state` as a worker reads it, as fast as the console answers."""

    def __init__(self, base_url: str, deadline: float):
        super().__init__(daemon=True)
        self.base_url, self.deadline = base_url, deadline
        self.states: list[dict] = []
        self.latencies_s: list[float] = []
        self.failed: Counter = Counter()

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {WORKER_TOKEN}"}, timeout=30) as client:
            while time.monotonic() < self.deadline:
                started = time.perf_counter()
                try:
                    response = client.get("/api/serving/state")
                except httpx.HTTPError as error:
                    self.failed[type(error).__name__] += 1
                    continue
                took = time.perf_counter() - started
                if response.status_code != 200:
                    self.failed[response.status_code] += 1
                    continue
                self.latencies_s.append(took)
                self.states.append(response.json())


def measure(base_url: str, token: str, writers: int, readers: int, duration_s: float, *, sqlite: bool) -> int:
    api = httpx.Client(base_url=base_url, headers={"Authorization": f"Token {token}"}, timeout=60)
    versions = [version["number"] for version in every_page(api, f"/api/models/{MODEL}/versions/") if version["status"] == "ready"]
    if len(versions) < 2:
        sys.exit(f"{MODEL} has {len(versions)} ready versions; a split needs two")
    start = api.post(f"/api/models/{MODEL}/release/", json={"routes": [{"version": versions[0], "weight": 90}, {"version": versions[1], "weight": 10}],
                                                            "reason": "state consistency bench: start"})
    if start.status_code != 201:  # e.g. a database used before with another --work-dir: its artifacts are not here
        sys.exit(f"the first split answered {start.status_code}: {start.text[:500]}")
    first_generation = api.get("/api/serving/state", headers={"Authorization": f"Bearer {WORKER_TOKEN}"}).json()["generation"]
    deadline = time.monotonic() + duration_s
    writer_threads = [Writer(base_url, token, versions, deadline, seed) for seed in range(writers)]
    reader_threads = [Reader(base_url, deadline) for _ in range(readers)]
    for thread in [*writer_threads, *reader_threads]:
        thread.start()
    for thread in [*writer_threads, *reader_threads]:
        thread.join(timeout=duration_s + 60)  # a request in flight at the deadline ends within its 30 s timeout
    history = release_history(api)
    states = [state for reader in reader_threads for state in reader.states]
    torn = [(state, why) for state in states if (why := torn_reason(state, history))]
    mismatched = [state for state in states if state_digest(state) != state.get("digest")]
    latencies = [took for reader in reader_threads for took in reader.latencies_s]
    made = sum((writer.made for writer in writer_threads), Counter())
    other = sum((writer.other for writer in writer_threads), Counter())
    failed_reads = sum((reader.failed for reader in reader_threads), Counter())
    report(states, torn, mismatched, latencies, made, other, failed_reads, first_generation, writers, readers, duration_s, sqlite)
    if torn or mismatched:
        return 1
    return 2 if not states or not made else 0


def every_page(api: httpx.Client, path: str) -> list[dict]:
    """Every item of a paged list, following `Link: rel="next"` (registry/api/pagination.py)."""
    items, url = [], f"{path}?limit=1000"
    while url:
        response = api.get(url)
        response.raise_for_status()
        items.extend(response.json())
        url = response.links.get("next", {}).get("url")
    return items


def release_history(api: httpx.Client) -> dict[str, list[dict]]:
    """Every model's releases, newest first, as the release history answers them."""
    return {model["name"]: every_page(api, f"/api/models/{model['name']}/releases/") for model in every_page(api, "/api/models/")}


def comparable(routes: list[dict]) -> list[tuple]:
    return [(route["version"], route["weight"], route.get("shadow")) for route in routes]


def torn_reason(state: dict, history: dict[str, list[dict]]) -> str | None:
    """Why ``state`` is not what its generation's releases say; None when it is."""
    generation, models = state["generation"], state.get("models", {})
    for name in models.keys() - history.keys():
        return f"{name} is in the state but has no release history"
    for name, releases in history.items():
        release = next((release for release in releases if release["generation"] <= generation), None)  # newest first
        entry = models.get(name)
        if release is None or release["action"] == "archive":
            if entry is not None:
                return f"{name} is served at generation {generation}, where its releases say it is not"
            continue
        if entry is None:
            return f"{name} is missing at generation {generation}; release {release['generation']} routes {comparable(release['routes'])}"
        if comparable(entry["routes"]) != comparable(release["routes"]) or entry.get("generation") != release["generation"]:
            return (f"{name} at generation {generation}: routes {comparable(entry['routes'])} of release {entry.get('generation')}, "
                    f"but release {release['generation']} (the newest at or below it) routes {comparable(release['routes'])}")
    return None


def report(states, torn, mismatched, latencies, made, other, failed_reads, first_generation, writers, readers, duration_s, sqlite) -> None:
    generations = [state["generation"] for state in states]
    print(f"\n{writers} writers, {readers} readers, {duration_s:g} s on {'SQLite (writers serialised: a weaker test)' if sqlite else 'PostgreSQL'}")
    print("| measure | value |")
    print("|---|---:|")
    print(f"| state reads (200) | {len(states)} |")
    print(f"| changes made (201) | {sum(made.values())} ({', '.join(f'{action} {n}' for action, n in sorted(made.items()))}) |")
    print(f"| torn states (routes ≠ generation's) | {len(torn)} |")
    print(f"| digest mismatches | {len(mismatched)} |")
    if latencies:
        print(f"| read latency p50 / p99 ms | {percentile(latencies, 0.5) * 1000:.1f} / {percentile(latencies, 0.99) * 1000:.1f} |")
    if generations:
        print(f"| generations read (distinct, range) | {len(set(generations))}, {min(generations)}–{max(generations)} (first {first_generation}) |")
    print(f"\nnot applied (action, status): {dict(other) or 'none'}; failed reads: {dict(failed_reads) or 'none'}")
    for state, why in torn[:MAX_EXAMPLES]:
        print(f"torn: {why}")
    for state in mismatched[:MAX_EXAMPLES]:
        print(f"digest mismatch at generation {state['generation']}: carries {state.get('digest')}, content is {state_digest(state)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="the database (default: DATABASE_URL); a throwaway PostgreSQL one")
    parser.add_argument("--allow-sqlite", action="store_true", help="run on SQLite anyway (a weaker test: its writers are serialised)")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--console-port", type=int, help="the console's loopback port (default: a free one)")
    parser.add_argument("--work-dir", help="keep the artifacts and the console's log here (an empty folder) instead of a temporary one")
    args = parser.parse_args()
    url = database_url(args.database_url, args.allow_sqlite)
    started = time.monotonic()
    code = run(url, args.writers, args.readers, args.duration_s, args.console_port, args.work_dir)
    print(f"\nbench took {time.monotonic() - started:.0f} s; exit {code}")
    sys.exit(code)


if __name__ == "__main__":
    main()
