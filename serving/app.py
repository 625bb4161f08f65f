"""The worker's HTTP surface: a raw ASGI app (no framework) for uvicorn + httptools.

The event loop only parses, validates, enqueues and answers; models run in executor
threads behind the batcher. Every failure is a `ServingError` mapped to its status in
`serving.errors`; anything else is our bug and answers 500 with the request id only.

What the headers alone can refuse (API key 401, Content-Type 415, Content-Encoding,
Content-Length 413) is refused before a byte of the body is read; slow or oversized
clients are cut off below the app, in `serving.http_protocol`. Error messages quote at
most a short prefix of anything the client sent (`errors.clip`).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serving import metrics, protocol
from serving.api_keys import ApiKeyRing, worker_token_matches
from serving.config import ConfigError
from serving.errors import (
    BadRequest, ClientDisconnected, DeadlineExceeded, InternalError, MethodNotAllowed, NotFound, NotReady,
    PayloadTooLarge, ServingError, Unauthorized, UnsupportedMediaType, VersionNotFound, clip,
)
from serving.reports import failed_total
from serving.shadow import ShadowMirror
from serving.repository import LoadedVersion, Repository

logger = logging.getLogger("serving.app")

JSON = b"application/json"
SHED_BODY = orjson.dumps({"error": "overloaded: too many requests in flight; retry later"})
SHED_HEADERS = ((b"content-type", JSON), (b"content-length", str(len(SHED_BODY)).encode()), (b"retry-after", b"1"))
SHED_BODY_MESSAGE = {"type": "http.response.body", "body": SHED_BODY}
SERVER_METADATA = orjson.dumps({"name": "modelops-serving", "version": "1", "extensions": ["binary_tensor_data"]})
MAX_REQUEST_ID_CHARS = 128
MAX_HEADER_INT_DIGITS = 18  # below 2**63: int() never sees thousands of digits
OPERATOR_PATHS = frozenset(("/health", "/metrics"))  # behind the worker token when so configured
Hook = Callable[[], Awaitable[None]]


class RequestHeaders:
    """The few request headers the server reads, picked out in one pass."""

    __slots__ = ("content_length", "request_id", "timeout_s", "routing_key", "header_length", "content_encoding",
                 "content_type", "authorization", "api_key")

    def __init__(self, raw: list[tuple[bytes, bytes]]):
        self.content_length = self.header_length = self.timeout_s = None
        self.request_id = self.routing_key = self.content_encoding = None
        self.content_type = self.authorization = self.api_key = None
        for name, value in raw:
            if name == b"content-length":
                self.content_length = _header_int(value, "Content-Length")
            elif name == b"x-request-id":
                self.request_id = value
            elif name == b"inference-header-content-length":
                self.header_length = _header_int(value, "Inference-Header-Content-Length")
            elif name == b"x-request-timeout-s":
                self.timeout_s = _header_timeout_s(value)
            elif name == b"x-routing-key":
                self.routing_key = value.decode("latin-1")
            elif name == b"content-encoding":
                self.content_encoding = value
            elif name == b"content-type":
                self.content_type = value
            elif name == b"authorization":
                self.authorization = value
            elif name == b"x-api-key":
                self.api_key = value


def _header_int(value: bytes, name: str) -> int:
    if not value.isdigit() or len(value) > MAX_HEADER_INT_DIGITS:
        raise BadRequest(f"header {name} must be a non-negative integer of at most {MAX_HEADER_INT_DIGITS} digits")
    return int(value)


def _check_body_type(content_type: bytes | None, allow_binary: bool) -> None:
    """JSON, or octet-stream for the binary tensor extension; no label is read as JSON (curl
    and tritonclient send none). Anything else (forms, text/plain) is 415: a browser can
    send those cross-site without asking first."""
    if content_type is None:
        return
    media = content_type.split(b";", 1)[0].strip().lower()
    if media == b"application/json" or (allow_binary and media == b"application/octet-stream"):
        return
    wanted = "application/json or application/octet-stream" if allow_binary else "application/json"
    raise UnsupportedMediaType(f"Content-Type '{clip(media.decode('latin-1'))}' is not supported here: send {wanted}")


def _header_timeout_s(value: bytes) -> float:
    try:
        timeout_s = float(value)
    except ValueError:
        raise BadRequest("header X-Request-Timeout-S must be a number of seconds") from None
    if not 0 < timeout_s < math.inf:
        raise BadRequest("header X-Request-Timeout-S must be positive")
    return timeout_s


class RequestIds:
    """Client-given ids when sane, else a per-process prefix and a counter (cheap, unique)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(4).hex()
        self._counter = itertools.count(1)

    def pick(self, given: bytes | None) -> bytes:
        if given and len(given) <= MAX_REQUEST_ID_CHARS and given.isascii():
            return given
        return f"{self._prefix}-{next(self._counter):x}".encode()


class Response:
    __slots__ = ("status", "body", "headers", "version", "content_type")

    def __init__(self, status: int, body: bytes, headers: tuple = (), version: LoadedVersion | None = None,
                 content_type: bytes = JSON):
        self.status, self.body, self.headers, self.version = status, body, headers, version
        self.content_type = content_type


class ServingApp:
    def __init__(self, repository: Repository, request_timeout_s: float, max_body_bytes: int):
        self.repository = repository
        self.request_timeout_s = request_timeout_s
        self.max_body_bytes = max_body_bytes
        self.on_startup: list[Hook] = []
        self.on_shutdown: list[Hook] = []
        # Inference requests between arrival and answer; past the cap, a canned 503 before
        # the body is read or parsed (SERVING_MAX_IN_FLIGHT, 0 = no cap).
        config = repository.config
        self.max_in_flight = getattr(config, "max_in_flight", 0) or math.inf
        self.in_flight = 0
        # Client keys for /infer and /predict (SERVING_API_KEYS), refreshed from the console.
        self.api_keys = ApiKeyRing(getattr(config, "api_keys", "off"))
        self._operator_token = _operator_token(config)
        self._ids = RequestIds()
        self.shadow = ShadowMirror()
        self._simple_routes: dict[str, Callable[[], Response]] = {
            "/v2/health/live": lambda: Response(200, b'{"live":true}'),
            "/v2/health/ready": self._server_ready,
            "/v2": lambda: Response(200, SERVER_METADATA),
            "/health": self._health,
            "/metrics": self._metrics,
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
        request_id = None
        try:
            headers = RequestHeaders(scope["headers"])
            request_id = self._ids.pick(headers.request_id)
            response = await self._route(scope, receive, headers, request_id, started_s)
        except ServingError as exc:
            response = self._error(exc, request_id)
        except Exception:
            request_id = request_id or self._ids.pick(None)
            logger.exception("unhandled error (request id %s)", request_id.decode())
            response = self._error(InternalError(request_id.decode()), request_id)
        finally:
            if is_inference:
                self.in_flight -= 1
        await self._send(send, response, request_id or self._ids.pick(None))
        self._account(path, is_inference, response, request_id, started_s)

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

    def _error(self, exc: ServingError, request_id: bytes | None) -> Response:
        version = exc.version
        if exc.status == 500 and not isinstance(exc, InternalError):
            logger.error("request %s failed: %s", request_id.decode() if request_id else "-", exc.message)
            exc = InternalError(request_id.decode() if request_id else "-")  # no details to the client
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

    def _account(self, path: str, is_inference: bool, response: Response, request_id, started_s: float) -> None:
        version = response.version
        if version is not None:
            version.metrics.record(response.status, time.monotonic() - started_s)
        elif is_inference:
            metrics.count_unrouted(response.status)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(orjson.dumps({
                "event": "request", "request_id": request_id.decode() if request_id else None, "path": path,
                "status": response.status, "version": version.version if version else None,
                "ms": round((time.monotonic() - started_s) * 1000, 3),
            }).decode())

    # ---- routing ------------------------------------------------------------------

    async def _route(self, scope, receive, headers: RequestHeaders, request_id: bytes, started_s: float) -> Response:
        path, method = scope["path"], scope["method"]
        if path.startswith("/v2/models/"):
            return await self._model_route(path[len("/v2/models/"):].split("/"), method, receive, headers, request_id, started_s)
        if path == "/predict":
            _require(method, "POST")
            return await self._predict(receive, headers, request_id, started_s)
        handler = self._simple_routes.get(path)
        if handler is None:
            raise NotFound(f"no such endpoint: {clip(path)}")
        _require(method, "GET")
        if self._operator_token is not None and path in OPERATOR_PATHS:
            if not worker_token_matches(headers.authorization, self._operator_token):
                raise Unauthorized(f"{path} needs the worker token (Authorization: Bearer)")
        return handler()

    def _server_ready(self) -> Response:
        if self.repository.is_ready:
            return Response(200, b'{"ready":true}')
        return Response(503, b'{"ready":false}', NotReady.headers)

    def _health(self) -> Response:
        # Drills read the failure total before and after a rollback to count failures.
        return Response(200, orjson.dumps({**self.repository.health(), "requests_failed_total": failed_total()}))

    def _metrics(self) -> Response:
        metrics.flush_pending()
        metrics.update_device_memory(self.repository.device)
        return Response(200, generate_latest(), content_type=CONTENT_TYPE_LATEST.encode())

    async def _model_route(self, parts, method, receive, headers, request_id, started_s) -> Response:
        name, version, action = _model_path(parts)
        if action == "infer":
            _require(method, "POST")
            return await self._infer(name, version, receive, headers, request_id, started_s)
        _require(method, "GET")
        if action == "ready":
            return self._model_ready(name, version)
        return self._model_metadata(name, version)

    # ---- inference ----------------------------------------------------------------

    async def _infer(self, name, version, receive, headers, request_id, started_s) -> Response:
        self._check_headers(headers, allow_binary=True)
        target = self._resolve(name, version, headers.routing_key)
        try:
            refusal = target.refusal(started_s + self._timeout_s(headers.timeout_s))
            if refusal is not None:  # overloaded: refuse before paying for the body
                raise refusal
            body = await self._receive_body(receive)
            decoded = protocol.decode_v2(body, headers.header_length, target.io)
            outputs = await self._run(target, decoded, headers, request_id, started_s)
            payload, json_length = protocol.encode_v2(target.model_name, target.version, decoded, outputs, target.io)
        except ServingError as exc:
            exc.version = target
            raise
        if version is None:
            self._mirror(name, target, decoded, outputs)
        if json_length is None:
            return Response(200, payload, (), target)
        return Response(200, payload, _binary_headers(json_length), target, b"application/octet-stream")

    async def _predict(self, receive, headers, request_id, started_s) -> Response:
        document = protocol.load_object(await self._read_body(receive, headers, allow_binary=False))
        name, version = protocol.predict_target(document)
        target = self._resolve(name, version, headers.routing_key)
        try:
            decoded = protocol.decode_predict(document, target.io)
            outputs = await self._run(target, decoded, headers, request_id, started_s)
        except ServingError as exc:
            exc.version = target
            raise
        if version is None:
            self._mirror(name, target, decoded, outputs)
        latency_ms = (time.monotonic() - started_s) * 1000
        body = protocol.encode_predict(request_id.decode(), name, target.version, decoded, outputs, target.io, latency_ms)
        return Response(200, body, (), target)

    def _mirror(self, name: str, served: LoadedVersion, decoded, outputs) -> None:
        routes = self.repository.router.table.models.get(name)
        if routes is not None and routes.shadows:
            self.shadow.after_response(routes, served, decoded, outputs)

    def _resolve(self, name: str, version: int | None, routing_key: str | None) -> LoadedVersion:
        if not self.repository.is_ready:
            raise NotReady("the worker is still loading its models")
        return self.repository.router.table.resolve(name, version, routing_key)

    def _timeout_s(self, *overrides_s: float | None) -> float:
        timeout_s = self.request_timeout_s
        for override_s in overrides_s:
            if override_s is not None and override_s < timeout_s:  # clients may only shorten it
                timeout_s = override_s
        return timeout_s

    async def _run(self, target: LoadedVersion, decoded, headers, request_id: bytes, started_s: float):
        deadline_s = started_s + self._timeout_s(headers.timeout_s, decoded.timeout_s)  # the batcher's clock is time.monotonic too
        outputs = await target.submit(decoded, deadline_s, request_id.decode())
        if time.monotonic() > deadline_s:
            raise DeadlineExceeded("deadline passed while the batch ran")
        return outputs

    def _check_headers(self, headers: RequestHeaders, allow_binary: bool) -> None:
        """Everything that headers alone can refuse is refused before a byte of the body is read."""
        self.api_keys.check(headers.api_key, headers.authorization)
        _check_body_type(headers.content_type, allow_binary)
        if headers.content_encoding not in (None, b"identity"):
            raise BadRequest("Content-Encoding is not supported; send the body uncompressed")
        if headers.content_length is not None and headers.content_length > self.max_body_bytes:
            raise PayloadTooLarge(f"body of {headers.content_length} bytes exceeds the limit of {self.max_body_bytes}")

    async def _read_body(self, receive, headers: RequestHeaders, allow_binary: bool) -> bytes:
        self._check_headers(headers, allow_binary)
        return await self._receive_body(receive)

    async def _receive_body(self, receive) -> bytes:
        message = await receive()
        body = message.get("body", b"")
        if not message.get("more_body"):
            return _whole(message, body)
        chunks, size = [body], len(body)
        while message.get("more_body"):
            message = await receive()
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                raise PayloadTooLarge(f"body exceeds the limit of {self.max_body_bytes} bytes")
        return _whole(message, b"".join(chunks))

    # ---- metadata -----------------------------------------------------------------

    def _model_metadata(self, name: str, version: int | None) -> Response:
        routes = self.repository.router.table.model(name)
        if version is not None:
            target = routes.targets.get(version)
            if target is None:
                raise VersionNotFound(name, version)
            return Response(200, orjson.dumps(target.metadata()), (), target)
        if not routes.targets:
            raise NotReady(f"model '{name}' has no loaded version")
        default = routes.targets[max(zip(routes.weights, routes.versions))[1]] if routes.versions else max(routes.targets.items())[1]
        document = default.metadata([str(v) for v in sorted(routes.targets)])
        document["parameters"] = {
            "generation": self.repository.router.table.generation,
            "routes": [{"version": v, "weight": w} for v, w in zip(routes.versions, routes.weights)],
            "warm": sorted(set(routes.targets) - set(routes.versions)),
            "shadows": [{"version": v, "shadow": f} for v, f in routes.shadows],
            "default_version": default.version,
        }
        return Response(200, orjson.dumps(document))

    def _model_ready(self, name: str, version: int | None) -> Response:
        routes = self.repository.router.table.model(name)
        if version is not None and version not in routes.targets:
            raise VersionNotFound(name, version)
        if version is None and not routes.versions:
            return Response(503, b'{"ready":false}', NotReady.headers)
        return Response(200, b'{"ready":true}')


def _whole(last_message: dict, body: bytes) -> bytes:
    # A disconnect (or the body deadline, which closes the connection) ends the body early:
    # a partial body is never decoded, let alone enqueued.
    if last_message["type"] == "http.disconnect":
        raise ClientDisconnected("the client went away before its body arrived")
    return body


def _operator_token(config) -> bytes | None:
    """The worker token when /metrics and /health require it (SERVING_METRICS_TOKEN_REQUIRED)."""
    if not getattr(config, "metrics_token_required", False):
        return None
    if not config.worker_token:
        raise ConfigError("SERVING_METRICS_TOKEN_REQUIRED=true needs SERVING_WORKER_TOKEN")
    return config.worker_token.encode()


def _model_path(parts: list[str]) -> tuple[str, int | None, str | None]:
    """/v2/models/{name}[/versions/{v}][/ready|/infer] -> (name, version, action)."""
    name, rest = parts[0], parts[1:]
    if not name:
        raise NotFound("model name missing from the path")
    version = None
    if rest[:1] == ["versions"]:
        if len(rest) < 2:
            raise NotFound("version missing from the path")
        version = _version_number(name, rest[1])
        rest = rest[2:]
    if rest and rest[0] not in ("ready", "infer") or len(rest) > 1:
        raise NotFound(f"no such endpoint under model '{clip(name)}'")
    return name, version, rest[0] if rest else None


def _version_number(name: str, text: str) -> int:
    if not text.isdigit() or len(text) > 9:
        raise VersionNotFound(name, text)
    return int(text)


def _require(method: str, expected: str) -> None:
    if method != expected:
        raise MethodNotAllowed(f"use {expected} here")


def _binary_headers(json_length: int) -> tuple:
    return ((b"inference-header-content-length", str(json_length).encode()),)
