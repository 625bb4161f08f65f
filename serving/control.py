"""The worker's control plane: receive desired states, converge, ack, report.

- Desired states arrive on the ``serving`` group of the channel layer (channels-redis),
  pushed by the console after every traffic change.
- At start, after every reconnect, and every ``reconcile_interval_s`` the worker also
  compares its generation with ``GET /api/serving/state``, so a missed push costs
  seconds, not correctness. Losing Redis never stops serving: the last state stays.
- Acks (``{worker, generation, ok, error?, load_ms}``) and the once-a-second report go
  to the console over HTTP with the worker token.
Nothing here runs per request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from dataclasses import dataclass

import httpx

from serving.reports import ReportBuilder

logger = logging.getLogger("serving.control")
SERVING_GROUP = "serving"
MAX_BACKOFF_S = 10.0


@dataclass(frozen=True)
class Identity:
    id: str
    host: str
    pid: int
    url: str
    device: str

    def as_dict(self) -> dict:
        return {"id": self.id, "host": self.host, "pid": self.pid, "url": self.url, "device": self.device}


def make_identity(public_url: str, device: str) -> Identity:
    host = socket.gethostname()
    worker_id = os.environ.get("SERVING_WORKER_ID") or f"{host}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
    return Identity(worker_id, host, os.getpid(), public_url, device)


class ControlPlane:
    """Plugs into a ``serving.worker.Worker`` through its startup and shutdown hooks."""

    def __init__(self, worker, *, redis_url: str, public_url: str, channel_prefix: str = "modelops", reconcile_interval_s: float = 3.0,
                 report_interval_s: float = 1.0):
        self.worker = worker
        self.redis_url = redis_url
        self.channel_prefix = channel_prefix
        self.identity = make_identity(public_url, worker.device)
        self.reconcile_interval_s = reconcile_interval_s
        self.report_interval_s = report_interval_s
        self.reports = ReportBuilder()
        self._apply_lock = asyncio.Lock()
        self._last_ok_generation: int | None = None
        self._tasks: list[asyncio.Task] = []
        self._http: httpx.AsyncClient | None = None
        worker.on_startup.append(self.start)
        worker.on_shutdown.insert(0, self.stop)

    async def start(self) -> None:
        config = self.worker.config
        self._http = httpx.AsyncClient(
            base_url=config.console_url, headers={"Authorization": f"Bearer {config.worker_token}"}, timeout=httpx.Timeout(5.0, connect=2.0)
        )
        if self.worker.repository.generation:
            self._last_ok_generation = self.worker.repository.generation
        loops = [self._reconcile_forever, self._report_forever] + ([self._listen] if self.redis_url else [])
        for loop in loops:
            self._tasks.append(asyncio.create_task(loop(), name=f"control-{loop.__name__}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()

    # ---- desired state ------------------------------------------------------------

    async def apply(self, state: dict) -> dict | None:
        """Converge on ``state`` unless it is older than what we serve; then ack."""
        async with self._apply_lock:
            generation = state.get("generation") if isinstance(state, dict) else None
            if not isinstance(generation, int):
                logger.warning('{"event": "state_ignored", "reason": "no generation"}')
                return None
            if self._last_ok_generation is not None and generation <= self._last_ok_generation:
                return None
            result = await self.worker.apply(state)
            if result.get("ok"):
                self._last_ok_generation = generation
            await self._ack(result)
            return result

    async def _ack(self, result: dict) -> None:
        body = {"worker": self.identity.id, **result}
        try:
            response = await self._http.post("/api/serving/acks", json=body)
            if response.status_code >= 400:
                logger.warning("ack of generation %s refused: %s %s", result.get("generation"), response.status_code, response.text[:200])
        except httpx.HTTPError as error:
            logger.warning("ack of generation %s not delivered: %s", result.get("generation"), error)

    async def reconcile(self) -> None:
        """Catch up from the console's state endpoint."""
        try:
            response = await self._http.get("/api/serving/state")
            response.raise_for_status()
            state = response.json()
        except (httpx.HTTPError, ValueError) as error:
            logger.warning("reconcile: cannot read the desired state: %s", error)
            return
        if state.get("generation") != self._last_ok_generation:
            await self.apply(state)

    async def _reconcile_forever(self) -> None:
        while True:
            await self.reconcile()
            await asyncio.sleep(self.reconcile_interval_s)

    async def _listen(self) -> None:
        backoff_s = 0.5
        while True:
            try:
                await self._listen_once()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - any transport failure: keep serving, retry
                logger.warning("channel layer lost (%s); serving the last state, retrying in %.1f s", error, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, MAX_BACKOFF_S)

    async def _listen_once(self) -> None:
        from channels_redis.core import RedisChannelLayer

        layer = RedisChannelLayer(hosts=[self.redis_url], prefix=self.channel_prefix, group_expiry=86400, expiry=30)
        channel = await layer.new_channel(prefix="serving-worker.")
        await layer.group_add(SERVING_GROUP, channel)
        try:
            await self.reconcile()  # whatever was published while we were away
            while True:
                message = await layer.receive(channel)
                if message.get("type") == "serving.apply":
                    await self.apply(message.get("state"))
        finally:
            await asyncio.shield(_quietly(layer.group_discard(SERVING_GROUP, channel)))
            await _quietly(layer.close_pools())  # a lost connection is replaced, not leaked

    # ---- reports ------------------------------------------------------------------

    async def _report_forever(self) -> None:
        while True:  # report first: a new worker is listed at once
            await self.send_report()
            await asyncio.sleep(self.report_interval_s)

    async def send_report(self) -> None:
        report = self.reports.build(self.identity.as_dict(), self.worker.repository)
        try:
            response = await self._http.post("/api/serving/reports", json=report)
            if response.status_code >= 400:
                logger.warning("report refused: %s %s", response.status_code, response.text[:200])
        except httpx.HTTPError as error:
            logger.debug("report not delivered: %s", error)


async def _quietly(awaitable) -> None:
    try:
        await asyncio.wait_for(awaitable, timeout=2.0)
    except Exception:  # noqa: BLE001 - cleanup on a connection that may be gone
        pass
