"""The worker's control plane: receive desired states, converge, ack, report.

- Desired states arrive on the ``serving`` group of the channel layer (channels-redis),
  as ``contract.APPLY_MESSAGE`` messages,
  pushed by the console after every traffic change. Anything that can reach Redis can
  publish there, so a push is used only when its signature holds (``state_signing``,
  a key derived from the worker token); a refused push changes nothing and is logged.
- A verified push is applied when it is newer than the state served in the same epoch.
  A push from another epoch (the console's database was replaced) makes the worker
  reconcile instead: a new epoch is taken from the console over HTTP, never the channel.
- At start, after every reconnect, and every ``reconcile_interval_s`` the worker reads
  ``GET /api/serving/state`` (worker token, console origin: trusted by its channel) and
  adopts it whenever its digest differs from the one applied, even at a lower
  generation: a counter that went backwards (a restored database) never freezes
  workers. Losing Redis never stops serving: the last state stays.
- Acks (``contract.Ack``) and the once-a-second report (``contract.WorkerReport``) go
  to the console over HTTP with the worker token. The first
  report goes before any ack: the console refuses acks from a worker it has not heard of.
  A graceful stop (``serving.drain``) is reported at once (``state: "draining"``), and
  the last report, once everything accepted was answered, says ``state: "stopped"``.
- Every state applied is persisted beside the artifact cache (``state_store``). A worker
  that started on that persisted state (the console could not answer) serves it, says
  so in its reports, acks it once the console answers, and retries the console every
  second meanwhile instead of every ``reconcile_interval_s``.
- The channel is re-joined with back-off (0.5 s doubling to 10 s) that starts again
  from 0.5 s once a connection was made, so a second outage is not waited out at 10 s.
  While connected, the worker joins the group again every second (a Redis that lost its
  data dropped the membership and kept the connection) and at least every quarter of its
  expiry: a member older than that is dropped at the console's next send. A Redis that does not
  take the connection within 2 s is a lost channel.
- A worker that follows the addresses ``manage.py runstack`` recorded (started by hand
  with neither ``CONSOLE_URL`` nor ``REDIS_URL``) is given callables that read them
  again: a stack started again may find the old port taken and take another, and the
  worker would retry the old one for ever. When its Redis does not answer, or its console
  does not answer a report, it reads the record before the next attempt and follows an
  address that moved, said in one line (and reconciles with a moved console at once). A
  record that is not a usable address is logged and the old one kept; an address the
  operator gave comes with no such callable, so it never changes.
- An unforeseen error in one pass of the reconcile or report loop is logged and the loop
  goes on; a silent end would leave the worker deaf to the console for good.
Nothing here runs per request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit, urlunsplit

import httpx
from redis.connection import parse_url

from serving.console_client import async_console_only, console_timeout
from serving.contract import APPLY_MESSAGE, MAX_MODEL_DIGESTS, SERVING_GROUP, WORKER_KEY_HEADER, Ack, WorkerIdentity, is_model_name
from serving.env import SettingError, check_http_url, env_str
from serving.logs import event
from serving.reports import ReportBuilder
from serving.state_signing import (
    PUSH_KEY_HEADER,
    PushExpired,
    SignatureRefused,
    checked_digest,
    model_digests,
    parse_push_key,
    state_digest,
    verify_push,
)
from serving.state_store import PersistedStateRefused
from serving.worker_key import worker_key

logger = logging.getLogger("serving.control")
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
UNREACHABLE_RETRY_S = 1.0  # how soon to ask again when the console did not answer
FINAL_REPORT_TIMEOUT_S = 2.0  # a stopping worker waits no longer for the console
# Answers after which the console has kept nothing of a report (too soon; its database
# unavailable: the report's row and figures are written in one transaction), and errors
# before a report was sent at all. Its figures go with the next report instead of being
# lost: the requests a worker answered while the console was down or restarting had been
# missing from its charts and from the rollout window judged after it. Any other failure
# (a timeout after sending, a 400, a 503 whose COMMIT is in doubt) may have been kept, or
# would be refused again.
NOTHING_STORED = frozenset({429, 503})
NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# A report refused as too soon waits the console's Retry-After, never longer than this:
# a worker silent for WORKER_GONE_AFTER_S is shown as gone.
MAX_REPORT_WAIT_S = 2.0
# A signed push that makes the worker ask the console (another epoch, other content at
# the same generation) does so at most this often; more within it are one later reconcile.
# Anyone who can publish to Redis could replay such a push as fast as they like, and
# every worker would query the console's database at that rate.
PUSH_RECONCILE_EVERY_S = 1.0
# channels_redis drops a group member older than this at the next send to the group (the
# console's layer keeps the default, a day): a worker joined once stopped hearing pushes a
# day later, and every change reached it only at the next reconcile. It joins again well before.
GROUP_EXPIRY_S = 86400.0
REJOINS_PER_EXPIRY = 4
# And at least this often: a Redis that lost its data (FLUSHALL, a failover to an empty
# replica, an eviction) drops the membership without breaking the connection, and every
# push then went to no one: changes reached the workers only at their next reconcile
# (28.7 s of 30 in the fault run) for up to six hours. A join is one ZADD and one EXPIRE.
REJOIN_EVERY_S = 1.0
# A Redis that does not take the connection is a lost channel (re-joined) after this. No
# read timeout: with one, a receive cancelled at a graceful stop could hang the loop's
# shutdown; a Redis that takes connections and never answers leaves the channel silent,
# and changes arrive at the next reconcile.
REDIS_CONNECT_TIMEOUT_S = 2.0
SHOWN_ADDRESS_CHARS = 200


@dataclass(frozen=True)
class Applied:
    """The state this worker serves, as last applied through the control plane."""

    generation: int | None = None
    epoch: str | None = None
    digest: str | None = None
    # model → digest of its entry as served (state_signing.model_digests): derived from the
    # content the digest names, so not compared.
    models: dict | None = field(default=None, compare=False)

    @classmethod
    def of(cls, state: dict, digest: str) -> Applied:
        """Model digests only of names the console can register, and none past the
        contract's bound: the console would refuse every report, where without them it
        proves the whole state only (a hand-written state may name models anything)."""
        models = {name: value for name, value in model_digests(state).items() if is_model_name(name)}
        return cls(state["generation"], state.get("epoch"), digest, models if len(models) <= MAX_MODEL_DIGESTS else None)


class Backoff:
    """Delays between reconnect attempts: doubling up to a cap, back to the first after
    a connection held (``reset``), so each outage is retried as quickly as the first."""

    def __init__(self, first_s: float = FIRST_BACKOFF_S, max_s: float = MAX_BACKOFF_S):
        self.first_s, self.max_s = first_s, max_s
        self._next_s = first_s

    def next_delay(self) -> float:
        delay = self._next_s
        self._next_s = min(delay * 2, self.max_s)
        return delay

    def reset(self) -> None:
        self._next_s = self.first_s


def make_identity(public_url: str, device: str) -> WorkerIdentity:
    host = socket.gethostname()
    worker_id = env_str("SERVING_WORKER_ID") or f"{host}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
    return WorkerIdentity(worker_id, host, os.getpid(), public_url, device)


class ControlPlane:
    """Plugs into a ``serving.worker.Worker`` through its startup and shutdown hooks."""

    def __init__(self, worker, *, redis_url: str, public_url: str, channel_prefix: str = "modelops", reconcile_interval_s: float = 3.0,
                 report_interval_s: float = 1.0, transport: httpx.AsyncBaseTransport | None = None,
                 recorded_redis_url: Callable[[], str] | None = None, recorded_console_url: Callable[[], str] | None = None):
        """``recorded_redis_url``, ``recorded_console_url``: for a worker that follows runstack's
        records only, each reads its record again ("" when there is none)."""
        self.worker = worker
        self.redis_url = redis_url
        self._recorded = {"redis": recorded_redis_url, "console": recorded_console_url}
        self._refused_records: dict[str, str] = {}  # the last unusable record of each, logged once
        self.channel_prefix = channel_prefix
        self.identity = make_identity(public_url, worker.device)
        self.reconcile_interval_s = reconcile_interval_s
        self.report_interval_s = report_interval_s
        self.reports = ReportBuilder()
        self.applied = Applied()
        # The console's public push key, from its last answer to GET /api/serving/state;
        # None until the console has answered (pushes then wait for a reconcile).
        self._push_key = None
        self._push_key_missing_said = False
        self._not_persisted: str | None = None  # why the state served is not the one on disk, while it is not
        self._not_persisted_kind: tuple | None = None
        self._transport = transport
        self._reported = False
        self._report_lock = asyncio.Lock()
        self._unacked: Ack | None = None  # the ack of a persisted state, sent once the console answers
        self._console_answered: bool | None = None  # None: not asked yet
        self._refused_status: int | None = None  # the status refusing this worker's reports since the last accepted one
        self._refused_reports = 0
        self._report_wait_s = 0.0  # a console's Retry-After on a refused report: the next waits at least this long
        self.group_expiry_s = GROUP_EXPIRY_S
        self._apply_lock = asyncio.Lock()
        self._push_reconciled_at = -PUSH_RECONCILE_EVERY_S  # loop time of the last reconcile a push asked for
        self._tried: tuple[str | None, int | None] = (None, None)  # epoch and generation of the newest state tried
        self._deferred_reconcile: asyncio.Task | None = None
        self._tasks: list[asyncio.Task] = []
        self._http: httpx.AsyncClient | None = None
        worker.on_startup.append(self.start)
        worker.on_shutdown.insert(0, self.stop)

    def _worker_key(self, config) -> str:
        return worker_key(self.identity.id, config.cache_dir, fixed_id=bool(env_str("SERVING_WORKER_ID")))

    async def start(self, *, run_loops: bool = True) -> None:
        config = self.worker.config
        headers = {"Authorization": f"Bearer {config.worker_token}", WORKER_KEY_HEADER: self._worker_key(config)}
        self._http = httpx.AsyncClient(
            base_url=config.console_url, headers=headers, timeout=console_timeout(config.console_timeout_s),
            follow_redirects=False, event_hooks={"request": [async_console_only(config.console_url)]}, transport=self._transport,
        )
        self.applied = self._initial_applied()
        if not run_loops:  # tests drive reconcile, pushes and reports by hand
            return
        if not self.redis_url:  # said once: a worker that only polls sees each change up to an interval late
            logger.warning(event("no_push_channel", reason="no Redis URL: changes arrive at each reconcile",
                                 reconcile_interval_s=self.reconcile_interval_s))
        for loop in [self._reconcile_forever, self._report_forever] + ([self._listen] if self.redis_url else []):
            self._tasks.append(asyncio.create_task(loop(), name=f"control-{loop.__name__}"))

    def _initial_applied(self) -> Applied:
        persisted = self.worker.initial_persisted
        if persisted is None:
            # Applied without its digest: the first reconcile confirms and acks it.
            return Applied(generation=self.worker.repository.generation)
        state, result = persisted
        applied = Applied.of(state, state["digest"])
        self._unacked = self._ack_of(result, applied.digest, applied.epoch)
        return applied

    async def stop(self) -> None:
        """First in the lifespan shutdown, which a graceful stop runs once every accepted
        request is answered: the last report says so, and the console shows the worker
        stopped at once instead of gone after WORKER_GONE_AFTER_S."""
        was_running = bool(self._tasks)
        self._recorded = dict.fromkeys(self._recorded)  # the last report follows no record: its reconcile would outlive the loops
        tasks = [*self._tasks, *([self._deferred_reconcile] if self._deferred_reconcile else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if was_running:
            try:
                await asyncio.wait_for(self.send_report("stopped"), FINAL_REPORT_TIMEOUT_S)
            except TimeoutError:
                logger.warning(event("report_not_delivered", reason=f"the last report took over {FINAL_REPORT_TIMEOUT_S:g} s", state="stopped"))
        if self._http is not None:
            await self._http.aclose()

    # ---- desired state ------------------------------------------------------------

    async def receive_push(self, state: object) -> dict | None:
        """A state from the channel: used only if signed, and newer, in the same epoch, than
        the newest state tried. One older than the state served is dropped; between the two,
        or of the generation applied but with other content (what was applied is not what
        the console issued), or of another epoch, the console is asked (reconcile)."""
        if self._push_key is None:
            # A push cannot be checked before the console has named its key: a worker
            # started during an outage took a superseded push someone replayed from Redis.
            # The console says what to serve instead (and names its key).
            return await self._reconcile_for_push()
        try:
            digest = verify_push(state, self._push_key)
        except PushExpired as expired:
            # The console's, but old: a replay, or a clock far off. The console says what is current.
            logger.warning(event("push_expired", reason=str(expired)))
            return await self._reconcile_for_push()
        except SignatureRefused as refusal:
            logger.warning(event("push_refused", reason=str(refusal)))
            return None
        async with self._apply_lock:  # read under it: a reconcile may change the epoch or generation meanwhile
            if state.get("epoch") == self.applied.epoch:
                generation = state.get("generation")
                if type(generation) is not int or digest == self.applied.digest:
                    return None
                newest, applied = self._newest_tried(), self.applied.generation
                if newest is None or generation > newest:
                    return await self._converge(state, digest)
                if applied is not None and generation < applied:
                    return None
        # Another epoch, or a generation between the one served and the newest tried: a
        # stale push, or a restored console's new one. The console says which.
        return await self._reconcile_for_push()

    def _newest_tried(self) -> int | None:
        """The newest generation of the applied epoch this worker applied or tried: a push
        older than it is stale. A state applied but for a failing model may leave the
        generation served older than the one tried, and a queued push between the two
        served a rolled-back canary again after the console had moved on."""
        tried_epoch, tried = self._tried
        applied = self.applied.generation
        if tried_epoch != self.applied.epoch or tried is None:
            return applied
        return tried if applied is None else max(tried, applied)

    async def _reconcile_for_push(self) -> dict | None:
        """reconcile() now, or once PUSH_RECONCILE_EVERY_S after the last one a push asked
        for (one deferred reconcile however many pushes ask meanwhile)."""
        wait_s = self._push_reconciled_at + PUSH_RECONCILE_EVERY_S - asyncio.get_running_loop().time()
        if wait_s <= 0:
            self._push_reconciled_at = asyncio.get_running_loop().time()
            return await self.reconcile()
        if self._deferred_reconcile is None or self._deferred_reconcile.done():
            self._deferred_reconcile = asyncio.create_task(self._reconcile_after(wait_s), name="control-deferred-reconcile")
        return None

    async def _reconcile_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self._push_reconciled_at = asyncio.get_running_loop().time()
        await self.reconcile()

    async def reconcile(self) -> dict | None:
        """Adopt the console's state whenever its digest differs from the one applied."""
        async with self._apply_lock:
            state = await self._fetch_state()
            if state is None:
                return None
            try:
                digest = checked_digest(state)
            except ValueError as error:
                logger.warning(event("state_refused", reason=str(error)))
                return None
            if digest == self.applied.digest:
                await self._ack_persisted()
                await self._persist_again(state, digest)
                return None
            return await self._converge(state, digest)

    async def _fetch_state(self) -> dict | None:
        answered_before = self._console_answered
        self._console_answered = False
        try:
            response = await self._http.get("/api/serving/state")
            response.raise_for_status()
            state = response.json()
        except (httpx.HTTPError, ValueError) as error:
            # Once per outage at WARNING: retried every second, it would be a line a second.
            log = logger.debug if answered_before is False else logger.warning
            log(event("reconcile_failed", reason=f"cannot read the desired state: {error}"))
            return None
        self._console_answered = True
        if answered_before is False:
            logger.info(event("console_answers_again"))
        self._note_push_key(response.headers.get(PUSH_KEY_HEADER))
        if not isinstance(state, dict):
            logger.warning(event("reconcile_failed", reason="the desired state is not a JSON object"))
            return None
        return state

    def _note_push_key(self, named: str | None) -> None:
        """The console's push key as its answer names it: a console whose secret changed
        names its new key, and a worker keeps the last one named."""
        try:
            self._push_key = parse_push_key(named)
        except ValueError as error:
            if not self._push_key_missing_said:  # once: it would be a line a reconcile
                self._push_key_missing_said = True
                logger.warning(event("push_key_missing", reason=f"{error}; pushes wait for each reconcile"))

    async def _converge(self, state: dict, digest: str) -> dict:
        result = await self.worker.apply(state)
        if type(state.get("generation")) is int:  # the console's word, lower too (a restored database)
            self._tried = (state.get("epoch"), state["generation"])
        ack = self._ack_of(result, digest, state.get("epoch"))
        if result.get("ok"):
            self.applied = Applied.of(state, digest)
            self._unacked = None  # superseded: the console hears of the state now served
            if not await self._persist(state):
                ack = self._not_persisted_ack(ack)
        elif result.get("kept"):
            # The other models' changes serve, so reports name what is served: its own
            # digest, which the console never issued. The ack says the state failed, and
            # why; each reconcile tries the console's state again. What serves is persisted
            # once it changes (a start-up apply persisted nothing: a restart during an
            # outage served the state before a rollback).
            served = self.worker.repository.applied_state
            served_digest = state_digest(served)
            if served_digest != self.applied.digest:
                self.applied = Applied.of(served, served_digest)
                self._unacked = None
                await self._persist(served)
        if not await self._ack(ack) and result.get("ok"):
            # Sent again at the next reconcile that finds this digest applied: otherwise a
            # console that missed it (an outage, a 503) never hears the worker followed,
            # and its drill waits for an ack that never comes. A failed apply needs no
            # resend: the next reconcile applies again and acks that.
            self._unacked = ack
        return result

    async def _persist(self, state: dict) -> bool:
        """Keep the applied state for a restart while the console cannot answer; whether it was kept."""
        store = self.worker.state_store
        try:
            await asyncio.to_thread(store.save, state)
        except (OSError, PersistedStateRefused) as error:
            # Once per kind of failure (its message names a new temporary file each time):
            # tried again at every reconcile, it was a warning every 3 s.
            kind = (type(error).__name__, getattr(error, "errno", None))
            log = logger.debug if self._not_persisted is not None and kind == self._not_persisted_kind else logger.warning
            log(event("state_not_persisted", path=str(store.path), reason=str(error)))
            self._not_persisted, self._not_persisted_kind = f"{store.path}: {error}", kind
            return False
        if self._not_persisted is not None:
            logger.info(event("state_persisted_again", path=str(store.path)))
        self._not_persisted = None
        return True

    def _not_persisted_ack(self, ack: Ack) -> Ack:
        """An ok ack that says the state is served but not kept: a worker whose cache could
        not be written was shown converged and ok, and restarted while the console was down
        it served the state from before a rollback (its file's)."""
        return replace(ack, error=f"applied, but not saved for a restart ({self._not_persisted}): started again while the console "
                                  "cannot answer, this worker would serve the state it saved before")

    async def _persist_again(self, state: dict, digest: str) -> None:
        """The state served could not be saved: try again at each reconcile, and once it is
        saved, ack it again without the warning (the console shows the last ack's words)."""
        if self._not_persisted is None or not await self._persist(state):
            return
        await self._ack(Ack(worker=self.identity.id, generation=state["generation"], digest=digest, ok=True, epoch=state.get("epoch")))

    async def _ack_persisted(self) -> None:
        """The console answers again and issued what the worker served from disk: say so."""
        if self._unacked is not None and await self._ack(self._unacked):
            self._unacked = None

    def _ack_of(self, result: dict, digest: str, epoch: str | None) -> Ack:
        """The ack of an apply result (``Repository.apply``'s {generation, ok, error?, load_ms})."""
        return Ack(worker=self.identity.id, generation=result["generation"], digest=digest, ok=result["ok"], epoch=epoch,
                   error=result.get("error"), load_ms=result.get("load_ms", 0.0))

    async def _ack(self, ack: Ack) -> bool:
        """Send an ack; False when it did not reach the console or the console could not
        take it now (5xx, 429: worth sending again). A 4xx is the console's answer to this
        ack, and the same ack would get it again."""
        if not self._reported:
            await self.send_report(only_first=True)
        try:
            response = await self._http.post("/api/serving/acks", json=ack.to_dict())
        except httpx.HTTPError as error:
            logger.warning("ack of generation %s not delivered: %s", ack.generation, error)
            return False
        if response.status_code >= 400:
            logger.warning("ack of generation %s refused: %s %s", ack.generation, response.status_code, response.text[:200])
        return not (response.status_code >= 500 or response.status_code == 429)

    async def _reconcile_forever(self) -> None:
        while True:
            await _survived(self.reconcile, "reconcile")
            await asyncio.sleep(self.reconcile_interval_s if self._console_answered else min(self.reconcile_interval_s, UNREACHABLE_RETRY_S))

    async def _listen(self) -> None:
        backoff = Backoff()
        while True:
            try:
                await self._listen_once(on_joined=backoff.reset)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - any transport failure: keep serving, retry
                delay_s = backoff.next_delay()
                logger.warning(event("channel_lost", reason=str(error), retry_in_s=delay_s))
                await asyncio.sleep(delay_s)
                await _survived(self._follow_recorded_redis, "follow_recorded_redis")  # read just before the attempt: the newest record

    async def _follow_recorded_redis(self) -> None:
        moved = await self._moved_record("redis", self.redis_url, _check_redis_url)
        if moved is not None:
            self.redis_url = moved

    async def _follow_recorded_console(self) -> None:
        moved = await self._moved_record("console", self.worker.config.console_url, _check_console_url)
        if moved is None:
            return
        self.worker.follow_console(moved)
        self._http.event_hooks = {"request": [async_console_only(moved)]}
        self._http.base_url = moved
        # What changed while it moved, now rather than at the next reconcile (up to reconcile_interval_s).
        if self._deferred_reconcile is None or self._deferred_reconcile.done():
            self._deferred_reconcile = asyncio.create_task(self._reconcile_after(0), name="control-deferred-reconcile")

    async def _moved_record(self, name: str, current: str, check: Callable[[str], str]) -> str | None:
        """The address recorded for ``name`` when this worker follows the record and it
        moved from ``current``; None otherwise. An unusable record is logged (once for each
        value) and ``current`` kept."""
        read = self._recorded[name]
        if read is None:
            return None
        recorded = (await asyncio.to_thread(read)).strip()
        if not recorded or recorded == current:
            return None
        try:
            moved = check(recorded)
        except ValueError as error:
            if self._refused_records.get(name) != recorded:
                self._refused_records[name] = recorded
                logger.warning(event("recorded_address_refused", service=name, reason=str(error)[:SHOWN_ADDRESS_CHARS],
                                     keeping=shown_address(current)))
            return None
        if moved == current:
            return None
        self._refused_records.pop(name, None)
        logger.info(event("recorded_address_followed", service=name, old=shown_address(current), new=shown_address(moved)))
        return moved

    async def _listen_once(self, on_joined=lambda: None) -> None:
        from serving.control_channel import WorkerChannelLayer  # channels_redis loads Django's settings module: not at import

        host = {"address": self.redis_url, "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_S}
        layer = WorkerChannelLayer(hosts=[host], prefix=self.channel_prefix, group_expiry=int(self.group_expiry_s), expiry=30)
        channel = await layer.new_channel(prefix="serving-worker.")
        await layer.group_add(SERVING_GROUP, channel)
        on_joined()
        logger.info(event("channel_joined", group=SERVING_GROUP))
        rejoining = asyncio.create_task(self._stay_in_group(layer, channel), name="control-rejoin")
        try:
            await self.reconcile()  # whatever was published while we were away
            while True:
                message = await layer.receive(channel)
                if message.get("type") == APPLY_MESSAGE:
                    await self.receive_push(message.get("state"))
        finally:
            rejoining.cancel()
            await asyncio.shield(_quietly(layer.group_discard(SERVING_GROUP, channel)))
            await _quietly(layer.close_pools())  # a lost connection is replaced, not leaked

    async def _stay_in_group(self, layer, channel: str) -> None:
        """Join the group again every quarter of its expiry, and every ``REJOIN_EVERY_S``
        (a Redis that lost its data). A join that fails is left to the receive on the same
        Redis, which fails too and re-joins with back-off; where the receive goes on (a Redis
        at maxmemory under noeviction refuses ZADD, not BZPOPMIN) the failure is said once,
        and again when a join holds, not every second."""
        failing = False
        while True:
            await asyncio.sleep(min(self.group_expiry_s / REJOINS_PER_EXPIRY, REJOIN_EVERY_S))
            try:
                await layer.group_add(SERVING_GROUP, channel)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - said once; the next pass tries again
                if not failing:
                    logger.warning(event("group_rejoin_failed", group=SERVING_GROUP, reason=f"{type(error).__name__}: {error}"[:300],
                                         retry_every_s=REJOIN_EVERY_S))
                failing = True
                continue
            if failing:
                logger.info(event("group_rejoined", group=SERVING_GROUP))
            failing = False

    # ---- reports ------------------------------------------------------------------

    async def _report_forever(self) -> None:
        while True:  # report first: a new worker is listed at once
            await _survived(self.send_report, "report")
            wait_s, self._report_wait_s = max(self.report_interval_s, self._report_wait_s), 0.0
            await self.worker.drain.changes_within(wait_s)  # a graceful stop is reported at once

    async def send_report(self, state: str | None = None, *, only_first: bool = False) -> None:
        """``state``: the worker's (serving, draining) unless given (the last report's "stopped").
        One at a time: an ack sends one too (``only_first``: none once one was accepted), and
        a report built while another was in flight made that one's ``not_stored`` give back
        the wrong figures."""
        async with self._report_lock:
            if not (only_first and self._reported):
                await self._send_report(state)

    async def _send_report(self, state: str | None) -> None:
        applied = {"generation": self.applied.generation, "digest": self.applied.digest, "epoch": self.applied.epoch,
                   "models": self.applied.models}
        report = self.reports.build(self.identity, self.worker.repository, applied, state or self.worker.drain.phase)
        try:
            response = await self._http.post("/api/serving/reports", json=report.to_dict())
            if response.status_code >= 400:
                # Once per streak at WARNING: a console answering 503 through an outage
                # would otherwise be a line a second from every worker.
                log = logger.debug if response.status_code == self._refused_status else logger.warning
                log(event("report_refused", status=response.status_code, body=response.text[:200]))
                self._refused_status, self._refused_reports = response.status_code, self._refused_reports + 1
                if response.status_code in NOTHING_STORED and not _maybe_kept(response):
                    self.reports.not_stored()  # the next report carries these figures too
                if response.status_code == 429:
                    self._report_wait_s = min(_retry_after_s(response), MAX_REPORT_WAIT_S)
            else:
                if self._refused_reports:
                    logger.info(event("reports_accepted_again", refused=self._refused_reports))
                self._refused_status, self._refused_reports = None, 0
                self._reported = True
        except httpx.HTTPError as error:
            logger.debug(event("report_not_delivered", reason=str(error)))
            if isinstance(error, NEVER_SENT):
                self.reports.not_stored()
            if isinstance(error, httpx.TransportError):  # no answer at all, and reports go every second: the console may have moved
                await _survived(self._follow_recorded_console, "follow_recorded_console")


def _maybe_kept(response: httpx.Response) -> bool:
    """A 503 that says the report was, or may have been, committed before the database
    went (console/outage.py: "committed", "in_doubt"): sent again, it could count twice."""
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and bool(body.keys() & {"committed", "in_doubt"})


def _retry_after_s(response: httpx.Response) -> float:
    """A refusal's ``Retry-After`` in seconds (0 when it has none, or not as a number)."""
    try:
        seconds = float(response.headers.get("Retry-After", "0"))
    except ValueError:
        return 0.0
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


async def _survived(step, name: str) -> None:
    """One pass of a loop that must go on: an error nobody foresaw (a bug, a model that
    fails to warm) is logged and the next pass comes, instead of ending the loop unseen."""
    try:
        await step()
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - logged with its traceback; the loop goes on
        logger.error(event("control_step_failed", step=name, reason=f"{type(error).__name__}: {error}"[:300]), exc_info=True)


def _check_redis_url(url: str) -> str:
    """``url`` if channels-redis can connect to it, else ValueError saying why."""
    if not parse_url(url).keys() & {"host", "path"}:  # "redis://" would mean localhost:6379, which no stack recorded
        raise ValueError("a Redis URL without a host")
    return url


def _check_console_url(url: str) -> str:
    try:
        return check_http_url("the recorded console address", url)
    except SettingError:  # its message repeats the value
        raise ValueError("not an http:// or https:// URL with a host") from None


def shown_address(url: str) -> str:
    """``url`` fit for a log line: a recorded Redis URL carries the stack's password."""
    try:
        parts = urlsplit(url)
        if parts.password is not None:
            parts = parts._replace(netloc=f"{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}")
        return urlunsplit(parts)[:SHOWN_ADDRESS_CHARS]
    except ValueError:
        return "(not a URL)"


async def _quietly(awaitable) -> None:
    try:
        await asyncio.wait_for(awaitable, timeout=2.0)
    except Exception:  # noqa: BLE001 - cleanup on a connection that may be gone
        pass
