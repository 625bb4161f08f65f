"""Send the demo model's held-out digits to a serving worker at a steady rate, so a
rollout under `make run` has traffic to judge."""

from __future__ import annotations

import logging
import math
import time

import httpx
import orjson
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from registry.building import demo
from serving.env import SettingError, check_http_url


class Command(BaseCommand):
    help = "Send the digits test split as /predict requests at --rate per second (Ctrl-C stops)."

    def add_arguments(self, parser):
        parser.add_argument("--url", default=None, help="the worker (default SERVING_PUBLIC_URL)")
        parser.add_argument("--rate", type=float, default=50.0, help="requests per second (default 50)")
        parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (default: until Ctrl-C)")
        parser.add_argument("--api-key", default="", help="an inference API key, when the worker requires one")

    def handle(self, *args, url=None, rate=50.0, seconds=0.0, api_key="", **options):
        if not 0 < rate <= 10_000:
            raise CommandError("--rate must be above 0 and at most 10000")
        if not (math.isfinite(seconds) and seconds >= 0):  # nan and inf sent forever, a negative number nothing
            raise CommandError(f"--seconds must be 0 (until Ctrl-C) or a finite number of seconds, got {seconds:g}")
        api_key = api_key.strip()
        if not all("!" <= char <= "~" for char in api_key):  # an HTTP header: printable ASCII; the key is not echoed
            raise CommandError("--api-key: not a key the console issued (expected printable ASCII without spaces)")
        target = _worker_url("--url" if url else "SERVING_PUBLIC_URL", url or settings.SERVING_PUBLIC_URL) + "/predict"
        pixels, _ = demo.demo_test_split()
        bodies = [orjson.dumps({"model_name": demo.demo_model_name, "inputs": [row.tolist()]}) for row in pixels]
        headers = {"Content-Type": "application/json", **({"X-API-Key": api_key} if api_key else {})}
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
        self.stdout.write(f"sending {len(bodies)} held-out digits round-robin to {target} at {rate:g}/s; Ctrl-C stops")
        counts: dict[str, int] = {}
        try:
            self._send(target, bodies, headers, rate, seconds, counts)
        except KeyboardInterrupt:
            pass
        _check_answered(counts, target)

    def _send(self, target: str, bodies: list[bytes], headers: dict, rate: float, seconds: float, counts: dict[str, int]) -> None:
        started = last_line = time.monotonic()
        with httpx.Client(timeout=5.0) as client:
            for sent in range(1 << 62):
                due = started + sent / rate
                if seconds and due - started >= seconds:
                    break
                time.sleep(max(0.0, due - time.monotonic()))
                outcome = _one(client, target, bodies[sent % len(bodies)], headers)
                counts[outcome] = counts.get(outcome, 0) + 1
                if time.monotonic() - last_line >= 5:
                    last_line = time.monotonic()
                    self._tally(counts)
        self._tally(counts)

    def _tally(self, counts: dict[str, int]) -> None:
        self.stdout.write("  ".join(f"{key}: {value}" for key, value in sorted(counts.items())))


def _check_answered(counts: dict[str, int], target: str) -> None:
    """CommandError (exit status 1) when requests were sent and none was answered 200: a
    run against nothing listening printed "ConnectError: 100" and exited 0, so a script or
    a tired operator took the traffic for sent."""
    sent = sum(counts.values())
    if sent and not any(outcome.startswith("200 ") for outcome in counts):
        raise CommandError(f"none of the {sent} requests to {target} was answered 200 (see the tally above): "
                           "is a worker serving the demo model there?")


def _worker_url(source: str, value: str) -> str:
    """An http(s) URL with a host; anything else used to fail every request, exit status 0."""
    try:
        return check_http_url(source, value, example="http://127.0.0.1:8001")  # a worker's port, not the console's
    except SettingError as error:
        raise CommandError(str(error)) from None


def _one(client: httpx.Client, target: str, body: bytes, headers: dict) -> str:
    """One request; what came back as "status vVERSION" (or the error's kind)."""
    try:
        answer = client.post(target, content=body, headers=headers)
    except httpx.HTTPError as error:
        return type(error).__name__
    return f"{answer.status_code} v{answer.headers.get('x-model-version', '?')}"
