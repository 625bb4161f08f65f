"""The worker's HTTP surface: a raw ASGI app (no framework) for uvicorn + httptools.

Only HTTP lives here: paths and methods, the headers, the body, and every answer. The
work between the body and the answer is the data plane's (`serving.dataplane`). Every
failure is a `ServingError` mapped to its status in `serving.errors`; anything else is
our bug and answers 500 with the request id only.

What the headers alone can refuse (API key 401, Content-Type 415, Content-Encoding 415,
Content-Length 413) is refused before a byte of the body is read; slow or oversized
clients are cut off below the app, in `serving.http_protocol`. A gzip or deflate body is
inflated only up to the body limit (`serving.http_request.inflate`).

HEAD is answered wherever GET is, with GET's status and headers: the app sends GET's
body and uvicorn leaves it out, keeping its Content-Length. Every 405 names the allowed
methods in `Allow`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from functools import partial

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from serving import http_request, metrics
from serving.api_keys import ApiKeyRing, worker_token_matches
from serving.config import ConfigError, ServingConfig
from serving.dataplane import Answer, DataPlane, RequestContext
from serving.drain import Drain
from serving.errors import AnswerTooLarge, DeadlineExceeded, InternalError, MethodNotAllowed, NotFound, NotReady, ServingError, Unauthorized, clip
from serving.http_request import BodyBuffer, RequestHeaders, RequestIds, check_headers, is_octet_stream, model_path, receive_body
from serving.loaded_version import LoadedVersion
from serving.protocol import BodyLimit, BodyNotJson

logger = logging.getLogger("serving.app")  # its name before the split: log lines keep their `logger` field

JSON = b"application/json"
SHED_BODY = orjson.dumps({"error": "overloaded: too many requests in flight; retry later"})
SHED_HEADERS = ((b"content-type", JSON), (b"content-length", str(len(SHED_BODY)).encode()), (b"retry-after", b"1"))
SHED_BODY_MESSAGE = {"type": "http.response.body", "body": SHED_BODY}
SERVER_METADATA = orjson.dumps({"name": "modelops-serving", "version": "1",
                                "extensions": ["binary_tensor_data", "model_configuration", "statistics"]})
DRAINING_BODY = b'{"ready":false,"draining":true}'
WRITE_HIGH_WATER_BYTES = 64 * 1024  # uvloop's default: a transport's writes pause past it
OPERATOR_PATHS = frozenset(("/health", "/metrics"))  # behind the worker token when so configured
Hook = Callable[[], Awaitable[None]]


class Response:
    __slots__ = ("body", "content_type", "headers", "status", "version")
    is_clients_deadline = False  # see ClientDeadlineRefusal

    def __init__(self, status: int, body: bytes, headers: tuple = (), version: LoadedVersion | None = None,
                 content_type: bytes = JSON):
        self.status, self.body, self.headers, self.version = status, body, headers, version
        self.content_type = content_type


class ClientDeadlineRefusal(Response):
    """A 504 under a deadline the client set shorter than the worker's own: sent as any 504,
    counted apart from the worker's failures (`serving.metrics`)."""

    __slots__ = ()
    is_clients_deadline = True


class ServingApp:
    def __init__(self, dataplane: DataPlane, config: ServingConfig, drain: Drain | None = None):
        self.dataplane = dataplane
        self.drain = drain or Drain()  # readiness turns 503 once a graceful stop began (serving.drain)
        self.max_body_bytes = config.max_body_bytes
        # An answer is written whole, and all answers held for clients are bounded together
        # (SERVING_MAX_UNSENT_BYTES): an inference answer larger than that bound alone is refused (AnswerTooLarge).
        # An answer within the transport's high-water mark never pauses its writes alone, so
        # it is never cut for its own size, whatever the bound.
        self.max_answer_bytes = max(config.max_unsent_bytes, WRITE_HIGH_WATER_BYTES) if config.max_unsent_bytes else math.inf
        dataplane.max_answer_bytes = self.max_answer_bytes  # so it refuses, unencoded, an answer that cannot fit
        self.body_buffer = BodyBuffer(config.max_body_buffer_bytes)  # every body being received, together
        self.on_startup: list[Hook] = []
        self.on_shutdown: list[Hook] = []
        # Inference requests between arrival and answer; past the cap, a canned 503 before
        # the body is read or parsed (SERVING_MAX_IN_FLIGHT, 0 = no cap).
        self.max_in_flight = config.max_in_flight or math.inf
        self.in_flight = 0
        # Client keys for /infer and /predict (SERVING_API_KEYS), refreshed from the console.
        self.api_keys = ApiKeyRing(config.api_keys)
        self._operator_token = _operator_token(config)
        self._ids = RequestIds()
        self._simple_routes: dict[str, Callable[[], Response]] = {
            "/v2/health/live": lambda: Response(200, b'{"live":true}'),
            "/v2/health/ready": self._server_ready,
            "/v2": lambda: Response(200, SERVER_METADATA),
            "/v2/": lambda: Response(200, SERVER_METADATA),  # the spec writes the path with its slash
            "/health": lambda: Response(200, orjson.dumps(self.dataplane.health())),
            "/metrics": lambda: Response(200, self.dataplane.metrics_text(), content_type=CONTENT_TYPE_LATEST.encode()),
        }

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            hooks = self.on_startup if message["type"] == "lifespan.startup" else self.on_shutdown
            try:
                for hook in hooks:
                    await hook()
            except Exception as exc:  # report to uvicorn, which exits instead of serving half-started
                logger.exception("lifespan hook failed")
                await send({"type": message["type"] + ".failed", "message": str(exc)})
                return
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return

    async def _http(self, scope, receive, send) -> None:
        path = scope["path"]
        is_inference = path.endswith("/infer") or path == "/predict"
        if is_inference:
            if self.in_flight >= self.max_in_flight:
                await self._shed(scope, send)
                return
            self.in_flight += 1
        started_s = time.monotonic()
        request_id = context = None
        try:
            headers = RequestHeaders(scope["headers"], inference=is_inference)
            request_id = self._ids.pick(headers.request_id)
            if is_inference:
                context = _context(headers, request_id, started_s)
            response = await self._route(scope, receive, headers, context)
            if is_inference and len(response.body) > self.max_answer_bytes:  # a probe or metadata is never refused for its size
                raise self._too_large(response)
        except ServingError as exc:
            response = self._error(exc, request_id, context)
        except Exception:
            request_id = request_id or self._ids.pick(None)
            logger.exception("unhandled error (request id %s)", request_id.decode())
            response = self._error(InternalError(request_id.decode()), request_id, context)
        finally:
            if is_inference:
                self.in_flight -= 1
        await self._send(send, response, request_id or self._ids.pick(None))
        self._account(path, is_inference, response, context, request_id, started_s)

    async def _shed(self, scope, send) -> None:
        """Over the in-flight cap: 503 + Retry-After, without reading or parsing the body."""
        given = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                given = value
                break
        await send({"type": "http.response.start", "status": 503,
                    "headers": [*SHED_HEADERS, (b"x-request-id", self._ids.pick(given))]})
        await send(SHED_BODY_MESSAGE)
        metrics.count_unrouted(503)

    def _too_large(self, response: Response) -> AnswerTooLarge:
        refusal = AnswerTooLarge(f"the answer is {len(response.body)} bytes, more than this worker holds for a client "
                                 f"({self.max_answer_bytes} bytes, SERVING_MAX_UNSENT_BYTES): ask for fewer rows at a time, or raise the setting")
        refusal.version = response.version
        return refusal

    def _error(self, exc: ServingError, request_id: bytes | None, context: RequestContext | None) -> Response:
        """``context``: an inference request's (None elsewhere, where no deadline is judged)."""
        version = exc.version
        if exc.status == 500 and not isinstance(exc, InternalError):
            logger.error("request %s failed: %s", request_id.decode() if request_id else "-", exc.message)
            exc = InternalError(request_id.decode() if request_id else "-")  # no details to the client
        if (isinstance(exc, DeadlineExceeded) and context is not None
                and exc.missed_clients_deadline(self.dataplane.server_deadline_s(context))):
            return ClientDeadlineRefusal(exc.status, exc.body(), exc.headers, version)
        return Response(exc.status, exc.body(), exc.headers, version)

    async def _send(self, send, response: Response, request_id: bytes) -> None:
        # One start + one body message (no more_body): uvicorn writes the head and the
        # body with one transport.write each, and finishes the response on the second.
        body = response.body
        headers = [(b"content-type", response.content_type), (b"content-length", b"%d" % len(body)),
                   (b"x-request-id", request_id)]
        if response.headers:
            headers += response.headers
        if response.version is not None:
            headers.append((b"x-model-version", response.version.version_header))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _account(self, path: str, is_inference: bool, response: Response, context: RequestContext | None, request_id,
                 started_s: float) -> None:
        version = response.version
        if version is not None and is_inference:  # metadata of a named version is no inference
            # From the body's end: a client sending its body slowly inflated the version's
            # latency, which a canary's latency check reads; a body that never ended (408,
            # 499) took the worker no time at all (five 20 s ones put 100 s in the +Inf bucket).
            took_s = 0.0 if context.body_read_s is None else time.monotonic() - context.body_read_s
            if context.client_chose or response.is_clients_deadline:
                _count_apart(version, response, took_s)
            else:  # the traffic the split sent: what the reports carry
                version.metrics.record(response.status, took_s)
        elif is_inference:
            metrics.count_unrouted(response.status)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(orjson.dumps({
                "event": "request", "request_id": request_id.decode() if request_id else None, "path": path,
                "status": response.status, "version": version.version if version else None,
                "ms": round((time.monotonic() - started_s) * 1000, 3),
            }).decode())

    # ---- routing ------------------------------------------------------------------

    async def _route(self, scope, receive, headers: RequestHeaders, context: RequestContext | None) -> Response:
        """``context``: an inference request's (None on any other path)."""
        path, method = scope["path"], scope["method"]
        if path.startswith("/v2/models/"):
            return await self._model_route(path[len("/v2/models/"):].split("/"), method, receive, headers, context)
        if path == "/predict":
            _require(method, "POST")
            coding = check_headers(headers, self.api_keys, self.max_body_bytes, allow_binary=False)
            # The model is named in the body: the most any loaded version takes.
            limit = self.dataplane.predict_body_limit() or BodyLimit(self.max_body_bytes)
            body = await receive_body(receive, self.body_buffer, headers.content_length, limit)
            if coding is not None:
                body = http_request.inflate(body, coding, limit, self.body_buffer)
            answer = await self.dataplane.predict(body, context)
            return Response(200, answer.body, (), answer.version)
        handler = self._simple_routes.get(path)
        if handler is None:
            raise NotFound(f"no such endpoint: {clip(path)}")
        _require(method, "GET")
        if path in OPERATOR_PATHS:
            self._check_operator(headers, path)
        return handler()

    def _check_operator(self, headers: RequestHeaders, what: str) -> None:
        """The worker token, when /metrics and /health require it: Triton's statistics tell
        the same (every version's traffic and timings), and were open while /metrics was locked."""
        if self._operator_token is not None and not worker_token_matches(headers.authorization, self._operator_token):
            raise Unauthorized(f"{what} needs the worker token (Authorization: Bearer)")

    async def _model_route(self, parts, method, receive, headers, context) -> Response:
        name, version, action = model_path(parts)
        if action == "infer":  # here, not in a coroutine of its own: one await less per request
            _require(method, "POST")
            coding = check_headers(headers, self.api_keys, self.max_body_bytes, allow_binary=True)
            # Read by the data plane with the routed version's limit (`LoadedVersion.body_limit`).
            read_body = partial(receive_body, receive, self.body_buffer, headers.content_length)
            if coding is not None:
                read_body = partial(http_request.receive_inflated_body, read_body, coding, self.body_buffer)
            try:
                answer = await self.dataplane.infer_v2(name, version, read_body,
                                                       headers.header_length, context)
            except BodyNotJson as exc:  # labelled binary, yet no header says where its JSON ends
                if headers.header_length is None and is_octet_stream(headers.content_type):
                    exc.blame_missing_header()
                raise
            return _inference_response(answer)
        _require(method, "GET")
        if action == "ready":
            return self._model_ready(name, version)
        if action == "config":  # open like the metadata, which shows the split too: perf_analyzer and tritonclient read it
            return Response(200, orjson.dumps(self.dataplane.model_config(name, version)))
        if action == "stats":
            self._check_operator(headers, "model statistics")
            return Response(200, orjson.dumps(self.dataplane.model_statistics(name, version)))
        document, target = self.dataplane.model_metadata(name, version)
        return Response(200, orjson.dumps(document), (), target)

    def _model_ready(self, name: str, version: int | None) -> Response:
        if self.drain.is_draining:
            return Response(503, DRAINING_BODY, NotReady.headers)
        document = {"name": name, "ready": self.dataplane.is_model_ready(name, version)}
        if version is not None:
            document["version"] = str(version)
        if document["ready"]:
            return Response(200, orjson.dumps(document))
        return Response(503, orjson.dumps(document), NotReady.headers)

    def _server_ready(self) -> Response:
        if self.drain.is_draining:  # still serving, but on its way out: balancers stop sending
            return Response(503, DRAINING_BODY, NotReady.headers)
        if self.dataplane.is_ready:
            return Response(200, b'{"ready":true}')
        return Response(503, b'{"ready":false}', NotReady.headers)


def _inference_response(answer: Answer) -> Response:
    if answer.json_length is None:
        return Response(200, answer.body, (), answer.version)
    return Response(200, answer.body, ((b"inference-header-content-length", str(answer.json_length).encode()),),
                    answer.version, b"application/octet-stream")


def _count_apart(version: LoadedVersion, response: Response, latency_s: float) -> None:
    """What the reports leave out of a version's figures, which are the traffic the split
    sent it (canary analysis, charts): a 504 under the client's own deadline, and any
    request that named its version. A server-side 504 of routed traffic stays in them."""
    if response.is_clients_deadline:
        version.metrics.record_client_deadline_refusal(latency_s)
    else:
        version.metrics.record_pinned(response.status, latency_s)


def _context(headers: RequestHeaders, request_id: bytes, started_s: float) -> RequestContext:
    return RequestContext(request_id.decode(), started_s, headers.timeout_s, headers.routing_key)


def _operator_token(config: ServingConfig) -> bytes | None:
    """The worker token when /metrics and /health require it (SERVING_METRICS_TOKEN_REQUIRED)."""
    if not config.metrics_token_required:
        return None
    if not config.worker_token:
        raise ConfigError("SERVING_METRICS_TOKEN_REQUIRED=true needs SERVING_WORKER_TOKEN")
    return config.worker_token.encode()


ALLOWED = {"GET": b"GET, HEAD", "POST": b"POST"}


def _require(method: str, expected: str) -> None:
    """`expected` is GET or POST; HEAD is served wherever GET is."""
    if method != expected and (method != "HEAD" or expected != "GET"):
        refusal = MethodNotAllowed(f"use {expected} here")
        refusal.headers = ((b"allow", ALLOWED[expected]),)  # RFC 9110: every 405 says what is allowed
        raise refusal
