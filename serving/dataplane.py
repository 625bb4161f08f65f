"""The data plane: from a model name and a request body to an answer, with no HTTP.

Model lookup and readiness, the traffic split, admission before the body is read,
decode, submit to the version's batcher, the deadline, encode, and the shadow mirror
after the answer; and the documents the metadata, readiness and health endpoints show,
with Triton's model-configuration and statistics documents (`serving.triton`).
The endpoints (`serving.endpoints`) call it with what they parsed from the request and
turn what it returns, or the `ServingError` it raises, into a response. A failure once
a version is chosen carries that version (`exc.version`), so it is counted against it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager, nullcontext
from functools import partial

from prometheus_client import generate_latest

from serving import metrics, protocol, triton
from serving.decode_budget import DecodeBudget, DecodeQueueFull, DecodeTimedOut, decode_cost, encode_cost
from serving.errors import AnswerTooLarge, BodyBufferFull, DeadlineExceeded, NotFound, NotReady, ServingError, VersionNotFound
from serving.loaded_version import LoadedVersion
from serving.reports import failed_total
from serving.repository import Repository
from serving.shadow import ShadowMirror

BodyReader = Callable[[protocol.BodyLimit], Awaitable[bytes]]
# Past this, a body is decoded in a thread: parsing and converting tens of megabytes took
# the event loop for seconds, stalling every other client. Below it, no thread hop. An
# answer estimated past it (`protocol.v2_answer_bytes`) is encoded in a thread too: a
# 159 MB answer encoded on the loop stalled every other request for 1.3 s.
DECODE_OFF_LOOP_BYTES = 1024 * 1024


def encodes_off_loop(answer_bytes: int) -> bool:
    """Whether an answer of about ``answer_bytes`` is encoded in a thread, under the decode
    budget: the same bound as a body's decode, so small answers take no thread hop."""
    return answer_bytes > DECODE_OFF_LOOP_BYTES


class RequestContext:
    """What the data plane needs of a request besides its body, parsed by the endpoints."""

    __slots__ = ("body_read_s", "client_chose", "request_id", "routing_key", "started_s", "timeout_s")

    def __init__(self, request_id: str, started_s: float, timeout_s: float | None, routing_key: str | None):
        self.request_id = request_id
        self.started_s = started_s  # the headers' arrival; monotonic clock, as the batcher's
        # When the body was whole: the worker's own deadline starts there (DataPlane.server_deadline_s).
        self.body_read_s: float | None = None
        self.timeout_s = timeout_s  # the client's own, from started_s, which may only shorten ours
        self.routing_key = routing_key
        # The client chose its version (named it, or chose it by an X-Routing-Key no gateway
        # vouches for): counted apart from the split's traffic, which the analysis judges.
        self.client_chose = False


class Answer:
    """An inference answer: the version that served it and the encoded body."""

    __slots__ = ("body", "json_length", "version")

    def __init__(self, version: LoadedVersion, body: bytes, json_length: int | None = None):
        self.version = version
        self.body = body
        self.json_length = json_length  # binary tensor extension: the JSON part's length, else None


class DataPlane:
    def __init__(self, repository: Repository, request_timeout_s: float, decode_budget_bytes: int = 512 * 1024 * 1024, *,
                 trust_routing_key: bool = False):
        self.repository = repository
        # A client that tries keys until X-Model-Version names the canary sends it whatever
        # it likes: an audit rolled a healthy canary back with 400s sent under one key.
        self.trust_routing_key = trust_routing_key
        self.request_timeout_s = request_timeout_s
        self.decode_budget = DecodeBudget(decode_budget_bytes)  # large bodies' decodes, together (serving.decode_budget)
        self.shadow = ShadowMirror()
        self._predict_limit: protocol.BodyLimit | None = None
        self._predict_limit_of = None  # the routing table it was found for
        # The largest inference answer the app sends (SERVING_MAX_UNSENT_BYTES; set by
        # ServingApp): one that cannot fit is refused before it is encoded.
        self.max_answer_bytes: float = math.inf

    def refuses_every_request(self) -> bool:
        """Whether every routed version would refuse a request arriving now (its queues
        full, or unable to answer within the deadline): the listen queue's keeper then
        refuses new connections instead of letting them wait to be refused."""
        deadline_s = time.monotonic() + self.request_timeout_s
        routed = [routes.targets[version] for routes in self.repository.router.table.models.values()
                  for version in routes.versions if version in routes.targets]
        return bool(routed) and all(target.refusal(deadline_s) is not None for target in routed)

    def predict_body_limit(self) -> protocol.BodyLimit | None:
        """What a /predict body may take before it is read: its model is named inside it, so
        the largest bound of any loaded version (`LoadedVersion.body_limit`); None when none
        is loaded. Found once per routing table (a batching change swaps the table too)."""
        table = self.repository.router.table
        if table is not self._predict_limit_of:
            self._predict_limit, self._predict_limit_of = _largest_body_limit(table), table
        return self._predict_limit

    # ---- inference ----------------------------------------------------------------

    async def infer_v2(self, name: str, version: int | None, read_body: BodyReader, header_length: int | None,
                       context: RequestContext) -> Answer:
        """A V2 inference request. Admission is asked before `read_body`: an overloaded
        worker does not pay for reading and decoding what it would refuse."""
        target = self._resolve(name, version, context)
        target.hold()  # from here to the answer: a swap that retires this version waits for it
        try:
            refusal = target.refusal(self._deadline_s(context, context.timeout_s))
            if refusal is not None:
                raise refusal
            body = await read_body(target.body_limit)  # 413 past what this version can take
            context.body_read_s = time.monotonic()
            if len(body) > DECODE_OFF_LOOP_BYTES:
                async with self._decoding(decode_cost(len(body), header_length), context, len(body)):
                    decoded = await asyncio.to_thread(protocol.decode_v2, body, header_length, target.io)
            else:
                decoded = protocol.decode_v2(body, header_length, target.io)
            outputs = await self._run(target, decoded, context)
            self._refuse_unsendable(protocol.v2_answer_least_bytes(decoded, outputs, target.io))
            answer_bytes = protocol.v2_answer_bytes(decoded, outputs, target.io)
            if encodes_off_loop(answer_bytes):
                async with self._encoding(answer_bytes, outputs, context, decoded):
                    payload, json_length = await asyncio.to_thread(
                        protocol.encode_v2, target.model_name, target.version, decoded, outputs, target.io)
            else:
                payload, json_length = protocol.encode_v2(target.model_name, target.version, decoded, outputs, target.io)
        except ServingError as exc:
            exc.version = target
            raise
        finally:
            target.release()
        if version is None:
            self._mirror(name, target, decoded, outputs)
        return Answer(target, payload, json_length)

    async def predict(self, body: bytes, context: RequestContext) -> Answer:
        """A `/predict` request: `{model_name, version?, inputs}`, its body read whole."""
        context.body_read_s = time.monotonic()
        is_large = len(body) > DECODE_OFF_LOOP_BYTES
        async with self._decoding(decode_cost(len(body)), context, len(body)) if is_large else nullcontext():
            document = await asyncio.to_thread(protocol.load_object, body) if is_large else protocol.load_object(body)
            name, version = protocol.predict_target(document)
            target = self._resolve(name, version, context)
            target.hold()
            try:
                if is_large:
                    decoded = await asyncio.to_thread(protocol.decode_predict, document, target.io)
                else:
                    decoded = protocol.decode_predict(document, target.io)
            except BaseException as exc:
                if isinstance(exc, ServingError):
                    exc.version = target
                target.release()
                raise
            del document  # its objects are not kept while the request waits for its batch
        try:
            outputs = await self._run(target, decoded, context)
            self._refuse_unsendable(protocol.predict_answer_least_bytes(decoded, outputs))
        except ServingError as exc:
            exc.version = target
            raise
        finally:
            target.release()
        if version is None:
            self._mirror(name, target, decoded, outputs)
        latency_ms = (time.monotonic() - context.started_s) * 1000
        encode = partial(protocol.encode_predict, context.request_id, name, target.version, decoded, outputs, target.io, latency_ms)
        answer_bytes = protocol.predict_answer_bytes(outputs)
        if not encodes_off_loop(answer_bytes):
            return Answer(target, encode())
        try:
            async with self._encoding(answer_bytes, outputs, context, decoded):
                return Answer(target, await asyncio.to_thread(encode))
        except ServingError as exc:
            exc.version = target
            raise

    def _refuse_unsendable(self, least_bytes: int) -> None:
        """AnswerTooLarge when an answer of at least ``least_bytes`` cannot be sent: the app
        refuses it after encoding anyway (ServingApp), and a 132 KB request's 1.44 GB answer
        took 12-20 s and 4.7 GB to encode first, holding other models' requests for 7.5 s."""
        if least_bytes > self.max_answer_bytes:
            raise AnswerTooLarge(f"the answer is at least {least_bytes} bytes, more than this worker holds for a client "
                                 f"({self.max_answer_bytes} bytes, SERVING_MAX_UNSENT_BYTES): ask for fewer rows at a time, "
                                 "or raise the setting")

    def _decoding(self, cost: int, context: RequestContext, body_bytes: int):
        """Room in the decode budget for a large body, within the request's deadline."""
        return self._budget_room(cost, self._deadline_s(context, context.timeout_s), body_bytes,
                                 "large bodies waiting to be decoded", "decode the body")

    def _encoding(self, answer_bytes: int, outputs, context: RequestContext, decoded):
        """Room in the same budget for a large answer's encode: it builds the answer's bytes as
        a decode builds objects, and the outputs it waits with are held meanwhile."""
        return self._budget_room(encode_cost(answer_bytes), self._deadline_s(context, context.timeout_s, decoded.timeout_s),
                                 sum(array.nbytes for array in outputs), "large answers waiting to be encoded", "encode the answer")

    @asynccontextmanager
    async def _budget_room(self, cost: int, deadline_s: float, waiting_bytes: int, waiting: str, doing: str):
        try:
            async with self.decode_budget.hold(cost, deadline_s, waiting_bytes):
                yield
        except DecodeQueueFull:
            raise BodyBufferFull(f"{waiting} fill the worker's buffer (SERVING_MAX_BODY_BUFFER_BYTES); retry later") from None
        except DecodeTimedOut:
            refusal = DeadlineExceeded(f"deadline exceeded waiting for memory to {doing} (large bodies and answers being "
                                       "decoded and encoded fill SERVING_MAX_BODY_BUFFER_BYTES)")
            refusal.deadline_s = deadline_s
            raise refusal from None

    def _resolve(self, name: str, version: int | None, context: RequestContext) -> LoadedVersion:
        if not self.repository.is_ready:
            raise NotReady(self.repository.not_ready_reason or "the worker is still loading its models")
        if version is not None or (context.routing_key and not self.trust_routing_key):  # an empty key is no key (traffic_split)
            context.client_chose = True
        return self.repository.router.table.resolve(name, version, context.routing_key)

    def server_deadline_s(self, context: RequestContext) -> float:
        """The worker's own deadline: SERVING_REQUEST_TIMEOUT_S from when the body was whole
        (before that, from the headers). The time a client takes to send its body is not the
        worker's, and SERVING_BODY_TIMEOUT_S bounds it (408): counted from the headers, a
        body sent slowly was a 504 counted as the version's failure, which let any client
        fail a canary or a drill."""
        return (context.started_s if context.body_read_s is None else context.body_read_s) + self.request_timeout_s

    def _deadline_s(self, context: RequestContext, *client_timeouts_s: float | None) -> float:
        """The worker's deadline, or an earlier one the client set itself (X-Request-Timeout-S,
        parameters.timeout; counted from the headers' arrival): clients may only shorten it."""
        deadline_s = self.server_deadline_s(context)
        for timeout_s in client_timeouts_s:
            if timeout_s is not None:
                deadline_s = min(deadline_s, context.started_s + timeout_s)
        return deadline_s

    async def _run(self, target: LoadedVersion, decoded, context: RequestContext):
        deadline_s = self._deadline_s(context, context.timeout_s, decoded.timeout_s)
        try:
            outputs = await target.submit(decoded, deadline_s, context.request_id, summarised=not context.client_chose)
            if time.monotonic() > deadline_s:
                raise DeadlineExceeded("deadline passed while the batch ran")
        except DeadlineExceeded as exc:
            exc.deadline_s = deadline_s  # whose deadline it is decides how the 504 is counted
            raise
        return outputs

    def _mirror(self, name: str, served: LoadedVersion, decoded, outputs) -> None:
        routes = self.repository.router.table.models.get(name)
        if routes is not None and routes.shadows:
            self.shadow.after_response(routes, served, decoded, outputs)

    # ---- what the other endpoints show --------------------------------------------

    @property
    def is_ready(self) -> bool:
        return self.repository.is_ready

    def model_metadata(self, name: str, version: int | None) -> tuple[dict, LoadedVersion | None]:
        """V2 model metadata, and the version it describes when one was named. A named
        version is described when a request naming it would be served (`resolve`): a warm
        or shadow one is the 404 its inference and its readiness get."""
        table = self.repository.router.table
        routes = table.model(name)
        if version is not None:
            target = table.resolve(name, version)
            return target.metadata(), target
        default = _default_version(routes, name)
        document = default.metadata([str(v) for v in sorted(routes.targets) if _is_requestable(table, name, v)])
        document["parameters"] = {
            "generation": table.generation,
            "routes": [{"version": v, "weight": w} for v, w in zip(routes.versions, routes.weights)],
            "warm": sorted(set(routes.targets) - set(routes.versions)),
            "shadows": [{"version": v, "shadow": f} for v, f in routes.shadows],
            "default_version": default.version,
        }
        return document, None

    def model_config(self, name: str, version: int | None) -> dict:
        """Triton's model configuration of the named version, else of the one the metadata shows.
        It answers as the metadata does (`resolve`): a warm or shadow version is the 404 its
        inference gets, and only versions a request may name are listed."""
        table = self.repository.router.table
        routes = table.model(name)
        target = _default_version(routes, name) if version is None else table.resolve(name, version)
        requestable = [v for v in routes.targets if _is_requestable(table, name, v)]
        return triton.model_config(target, requestable, self.repository.device,
                                   self.repository.config.max_batches_in_flight, self.request_timeout_s)

    def model_statistics(self, name: str | None, version: int | None) -> dict:
        """Triton's statistics of every loaded version, of one model's (`name`), or of one."""
        metrics.flush_pending()  # success and fail counts wait in the pending lists
        table = self.repository.router.table
        if name is None:
            targets = [target for _, routes in sorted(table.models.items()) for _, target in sorted(routes.targets.items())]
        elif version is None:
            targets = [target for _, target in sorted(table.model(name).targets.items())]
        else:
            targets = [_loaded(table.model(name), name, version)]
        return triton.model_statistics(targets, time.time() - time.monotonic())

    def is_model_ready(self, name: str, version: int | None) -> bool:
        """A named version is ready when a request naming it would be served: otherwise the
        404 its inference would get (unknown, or loaded but taking no traffic)."""
        table = self.repository.router.table
        if version is None:
            return bool(table.model(name).versions)
        table.resolve(name, version)
        return True

    def health(self) -> dict:
        # Drills read the failure total before and after a rollback to count failures.
        return {**self.repository.health(), "requests_failed_total": failed_total()}

    def metrics_text(self) -> bytes:
        """The Prometheus exposition, every pending per-request count folded in first."""
        metrics.flush_pending()
        metrics.update_device_memory(self.repository.device)
        return generate_latest()


def _largest_body_limit(table) -> protocol.BodyLimit | None:
    limits = [target.body_limit for routes in table.models.values() for target in routes.targets.values()]
    if not limits:
        return None
    largest = max(limits, key=lambda limit: limit.max_bytes)
    if largest.reason is None:  # SERVING_MAX_BODY_BYTES: its own words
        return largest
    return protocol.BodyLimit(largest.max_bytes, f"no model this worker serves takes more; the largest, {largest.reason}")


def _is_requestable(table, name: str, version: int) -> bool:
    """Whether a request may name `version`: asked of the routing table's own `resolve`, so
    what the metadata lists and what inference serves cannot drift apart."""
    try:
        table.resolve(name, version)
    except NotFound:
        return False
    return True


def _loaded(routes, name: str, version: int) -> LoadedVersion:
    target = routes.targets.get(version)
    if target is None:
        raise VersionNotFound(name, version)
    return target


def _default_version(routes, name: str) -> LoadedVersion:
    """What a model's path without a version describes: the most weighted routed version
    (at a tie the older, usually the stable one: 50/50 described the canary), else the
    newest loaded one."""
    if not routes.targets:
        raise NotReady(routes.unavailable or f"model '{name}' has no loaded version")
    if routes.versions:
        return routes.targets[max(zip(routes.weights, routes.versions), key=lambda route: (route[0], -route[1]))[1]]
    return max(routes.targets.items())[1]
