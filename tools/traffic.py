"""Steady client load on live workers, for the rollout tests and bench/rollout_bench.py:
a few client threads send `/predict` requests round robin over the workers at a fixed
total rate, and keep every answer's time, status and served version (the worker's
``x-model-version`` header, on errors too), so a test can ask what the canary answered
between two moments.

Outside tests/ because both the integration tests and the benchmarks use it. Paced, not
closed-loop: a machine of two cores also runs the console, Celery and the workers, and a
client as fast as it can go would starve them. A thread that falls behind skips the
missed sends instead of bursting to catch up.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import httpx
import numpy as np
import orjson

TRANSPORT_ERROR = 0  # the status recorded for an answer that never came


@dataclass(frozen=True)
class Answer:
    sent: float  # time.monotonic() when the request left
    at: float  # time.monotonic() when its answer came back
    status: int
    version: int | None  # None when the worker named no version (or the request never reached one)


def request_bodies(model: str, *, width: int = 64, rows: int = 4, hot_share: float = 0.0, hot_feature: int = 0,
                   hot_value: float = 8.0, count: int = 200, seed: int = 0) -> list[bytes]:
    """``count`` serialised `/predict` bodies of ``rows`` standard-normal rows of ``width``
    features; ``round(count * hot_share)`` of them, in random places (a regular spacing
    would send them all down one client thread to one worker), carry one row whose
    ``hot_feature`` is ``hot_value``: the input a planted regression trips on."""
    rng = np.random.default_rng(seed)
    hot = set(rng.choice(count, size=round(count * hot_share), replace=False).tolist())
    bodies = []
    for index in range(count):
        inputs = rng.standard_normal((rows, width)).astype(np.float32)
        if index in hot:
            inputs[rng.integers(rows), hot_feature] = hot_value
        bodies.append(orjson.dumps({"model_name": model, "inputs": inputs.tolist()}))
    return bodies


class SteadyLoad:
    """``rate_per_s`` requests a second in all (change it while running), spread over
    ``threads`` threads, each body and worker in turn. Use as a context manager."""

    def __init__(self, urls: Sequence[str], bodies: Sequence[bytes], rate_per_s: float, *, threads: int = 4, timeout_s: float = 10.0):
        self.urls, self.bodies, self.rate_per_s, self.timeout_s = list(urls), list(bodies), rate_per_s, timeout_s
        self._answers: list[Answer] = []  # appends from several threads: list.append is atomic
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(index, threads), daemon=True, name=f"load-{index}")
                         for index in range(threads)]

    def __enter__(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 5)

    def answers(self, since: float = -math.inf, until: float = math.inf) -> list[Answer]:
        """Answers that came back in [since, until) (time.monotonic())."""
        return [answer for answer in list(self._answers) if since <= answer.at < until]

    def counts(self, since: float = -math.inf, until: float = math.inf) -> collections.Counter:
        """(version, status) → how many answers, over [since, until)."""
        return collections.Counter((answer.version, answer.status) for answer in self.answers(since, until))

    def _run(self, index: int, threads: int) -> None:
        turn = index
        next_s = time.monotonic() + index / self.rate_per_s if self.rate_per_s > 0 else 0.0  # out of step with each other
        with httpx.Client(timeout=self.timeout_s, headers={"Content-Type": "application/json"}) as client:
            while not self._stop.is_set():
                period_s = threads / self.rate_per_s if self.rate_per_s > 0 else 0.1
                self._stop.wait(max(0.0, next_s - time.monotonic()))
                next_s = max(next_s + period_s, time.monotonic())  # behind: skip, do not burst
                if self.rate_per_s <= 0 or self._stop.is_set():
                    continue
                self._answers.append(self._send(client, self.urls[turn % len(self.urls)], self.bodies[turn % len(self.bodies)]))
                turn += threads

    def _send(self, client: httpx.Client, url: str, body: bytes) -> Answer:
        sent = time.monotonic()
        try:
            response = client.post(url + "/predict", content=body)
        except httpx.HTTPError:
            return Answer(sent, time.monotonic(), TRANSPORT_ERROR, None)
        header = response.headers.get("x-model-version")
        return Answer(sent, time.monotonic(), response.status_code, int(header) if header and header.isdigit() else None)
