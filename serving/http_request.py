"""What the endpoints read from an HTTP request: the few headers they use, the model
path, the request id, and the body.

Everything the headers alone can refuse (API key, media type, encoding, declared size)
is refused by `check_headers`, before a byte of the body is read. Each refusal is its own
`ServingError` naming what was wrong and quoting at most a short prefix of what the
client sent (`errors.clip`).

A gzip or deflate body (tritonclient's `request_compression_algorithm`) is inflated after
it arrived whole, never past the body limit: a megabyte can claim a gigabyte, so the
inflater is asked for at most the limit plus one byte, and what it produces is taken from
the body buffer like received bytes while it works.

The body limit is a `BodyLimit`: SERVING_MAX_BODY_BYTES, or for V2 inference the bound of
the version the request was routed to (`protocol.v2_body_limit`), which is known before
the body is read.
"""

from __future__ import annotations

import itertools
import math
import os
import zlib

from serving.api_keys import ApiKeyRing
from serving.errors import (
    BadRequest,
    BodyBufferFull,
    ClientDisconnected,
    NotFound,
    PayloadTooLarge,
    UnsupportedMediaType,
    VersionNotFound,
    clip,
)
from serving.protocol import BodyLimit

MAX_REQUEST_ID_CHARS = 128
MAX_HEADER_INT_DIGITS = 18  # below 2**63: int() never sees thousands of digits
LARGE_BODY_BYTES = 1024 * 1024  # past this, a body may use only half the body buffer


class RequestHeaders:
    """The few request headers the server reads, picked out in one pass."""

    __slots__ = ("api_key", "authorization", "content_encoding", "content_length", "content_type", "header_length",
                 "request_id", "routing_key", "timeout_s")

    def __init__(self, raw: list[tuple[bytes, bytes]], inference: bool = True):
        """``inference``: an inference request's, whose own headers (the binary JSON's
        length, the deadline) are read; elsewhere they are ignored, so a proxy that adds one
        to every request cannot make a health probe a 400."""
        self.content_length = self.header_length = self.timeout_s = None
        self.request_id = self.routing_key = self.content_encoding = None
        self.content_type = self.authorization = self.api_key = None
        for name, value in raw:
            if name == b"content-length":
                self.content_length = _header_int(value, "Content-Length")
            elif name == b"x-request-id":
                self.request_id = value
            elif name == b"inference-header-content-length" and inference:
                self.header_length = _header_int(value, "Inference-Header-Content-Length")
            elif name == b"x-request-timeout-s" and inference:
                self.timeout_s = _header_timeout_s(value)
            elif name == b"x-routing-key":
                self.routing_key = value.decode("latin-1")
            elif name == b"content-encoding":
                self.content_encoding = value
            elif name == b"content-type":
                self.content_type = value
            elif name == b"authorization":
                self.authorization = _once(self.authorization, value, "Authorization")
            elif name == b"x-api-key":
                self.api_key = _once(self.api_key, value, "X-API-Key")


# Optional whitespace around a field value (RFC 9110 §5.5): httptools leaves the trailing
# part, and frames the body by a padded Content-Length all the same.
OWS = b" \t"


def _once(earlier: bytes | None, value: bytes, name: str) -> bytes:
    """A credential header's value, given once: a gateway in front that checks (or counts)
    the first of two keys, and this worker that read the last, each let another key in."""
    if earlier is not None:
        raise BadRequest(f"header {name} must be given once")
    return value.strip(OWS)


def _header_int(value: bytes, name: str) -> int:
    value = value.strip(OWS)  # only OWS: bytes.strip() would take a form feed or a vertical tab too
    if not value.isdigit() or len(value) > MAX_HEADER_INT_DIGITS:
        raise BadRequest(f"header {name} must be a non-negative integer of at most {MAX_HEADER_INT_DIGITS} digits")
    return int(value)


def _header_timeout_s(value: bytes) -> float:
    try:
        if b"_" in value:  # float() reads "1_0" as 10
            raise ValueError
        timeout_s = float(value)
    except ValueError:
        raise BadRequest("header X-Request-Timeout-S must be a number of seconds") from None
    if not 0 < timeout_s < math.inf:
        raise BadRequest("header X-Request-Timeout-S must be a positive, finite number of seconds")
    return timeout_s


def check_headers(headers: RequestHeaders, api_keys: ApiKeyRing, max_body_bytes: int, allow_binary: bool) -> str | None:
    """Everything that headers alone can refuse is refused before a byte of the body is read.
    Returns the body's content coding to undo ("gzip", "deflate"), or None."""
    api_keys.check(headers.api_key, headers.authorization)
    check_body_type(headers.content_type, allow_binary)
    coding = None if headers.content_encoding is None else content_coding(headers.content_encoding)
    if headers.content_length is not None and headers.content_length > max_body_bytes:
        raise PayloadTooLarge(f"body of {headers.content_length} bytes exceeds the limit of {max_body_bytes}")
    return coding


# zlib window bits per coding, as Triton reads them: gzip's wrapper; "deflate" is the zlib
# format (RFC 9110 8.4.1.2), which is what tritonclient sends.
INFLATE_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
ACCEPTED_CODINGS = b"gzip, deflate, identity"
INFLATE_INPUT_BYTES = 64 * 1024  # compressed bytes handed to the inflater at once


def content_coding(value: bytes) -> str | None:
    coding = value.strip().lower().decode("latin-1")
    if coding == "identity":
        return None
    if coding not in INFLATE_WBITS:
        refusal = UnsupportedMediaType(f"Content-Encoding '{clip(coding)}' is not supported: send gzip, deflate or identity")
        refusal.headers = ((b"accept-encoding", ACCEPTED_CODINGS),)  # RFC 9110 15.5.16
        raise refusal
    return coding


async def receive_inflated_body(read_body, coding: str, buffer: BodyBuffer, limit: BodyLimit) -> bytes:
    return inflate(await read_body(limit), coding, limit, buffer)


def inflate(body: bytes, coding: str, limit: BodyLimit, buffer: BodyBuffer) -> bytes:
    """The body with its content coding undone, refused (413) as soon as it would pass
    `limit`: the inflater is never asked for more than that plus one byte. It is fed the
    compressed bytes a slice at a time, so what it leaves over stays small."""
    max_body_bytes = limit.max_bytes
    inflater = zlib.decompressobj(INFLATE_WBITS[coding])
    view, chunks, size, taken = memoryview(body), [], 0, 0
    try:
        for start in range(0, len(view), INFLATE_INPUT_BYTES):
            pending = view[start:start + INFLATE_INPUT_BYTES]
            while pending and not inflater.eof:
                chunk = inflater.decompress(pending, max_body_bytes + 1 - size)
                pending = inflater.unconsumed_tail  # left only when the output reached the bound
                size += len(chunk)
                if size > max_body_bytes:
                    raise limit.too_large(f"body inflated ({coding})")
                buffer.take(len(chunk), size)
                taken += len(chunk)
                chunks.append(chunk)
            if inflater.eof:
                break
    except zlib.error as exc:
        raise BadRequest(f"body is not valid {coding} data (Content-Encoding: {coding}): {clip(str(exc))}") from None
    finally:
        buffer.give_back(taken)
    if not inflater.eof:
        raise BadRequest(f"body ends before its {coding} data does (Content-Encoding: {coding})")
    if inflater.unused_data or start + INFLATE_INPUT_BYTES < len(view):
        raise BadRequest(f"body has bytes after the end of its {coding} data (Content-Encoding: {coding})")
    return b"".join(chunks)


def is_octet_stream(content_type: bytes | None) -> bool:
    return content_type is not None and content_type.split(b";", 1)[0].strip().lower() == b"application/octet-stream"


def check_body_type(content_type: bytes | None, allow_binary: bool) -> None:
    """JSON, or octet-stream for the binary tensor extension; no label is read as JSON (curl
    and tritonclient send none). Anything else (forms, text/plain) is 415: a browser can
    send those cross-site without asking first."""
    if content_type is None:
        return
    media, _, parameters = content_type.partition(b";")
    media = media.strip().lower()
    if media == b"application/json":
        _refuse_charset_other_than_utf8(parameters)
        return
    if allow_binary and media == b"application/octet-stream":
        return
    wanted = "application/json or application/octet-stream" if allow_binary else "application/json"
    raise UnsupportedMediaType(f"Content-Type '{clip(media.decode('latin-1'))}' is not supported here: send {wanted}")


JSON_CHARSETS = frozenset((b"utf-8", b"utf8", b"us-ascii", b"ascii"))  # ASCII is UTF-8's subset


def _refuse_charset_other_than_utf8(parameters: bytes) -> None:
    """JSON is UTF-8 (RFC 8259 §8.1), and the worker reads it so whatever the label says:
    a proxy in front that honours ``charset=utf-7`` reads other text (+ACI- is a quote)
    than the worker does. Another charset is a 415, as at the console's API."""
    for parameter in parameters.split(b";"):
        name, _, value = parameter.partition(b"=")
        if name.strip().lower() == b"charset":
            charset = value.strip(OWS).strip(b'"').lower()
            if charset not in JSON_CHARSETS:
                raise UnsupportedMediaType(f"JSON in charset '{clip(charset.decode('latin-1'))}' is not supported: send UTF-8")


class RequestIds:
    """Client-given ids when sane, else a per-process prefix and a counter (cheap, unique)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(4).hex()
        self._counter = itertools.count(1)

    def pick(self, given: bytes | None) -> bytes:
        if given and len(given) <= MAX_REQUEST_ID_CHARS and given.isascii():
            return given
        return f"{self._prefix}-{next(self._counter):x}".encode()


MODEL_ACTIONS = ("ready", "infer", "config", "stats")


def model_path(parts: list[str]) -> tuple[str | None, int | None, str | None]:
    """/v2/models/{name}[/versions/{v}][/ready|/infer|/config|/stats] -> (name, version, action);
    /v2/models/stats (every model's statistics, as Triton has it) -> (None, None, "stats")."""
    if parts == ["stats"]:
        return None, None, "stats"
    name, rest = parts[0], parts[1:]
    if not name:
        raise NotFound("model name missing from the path")
    version = None
    if rest[:1] == ["versions"]:
        if len(rest) < 2:
            raise NotFound("version missing from the path")
        version = _version_number(name, rest[1])
        rest = rest[2:]
    if rest and rest[0] not in MODEL_ACTIONS or len(rest) > 1:
        raise NotFound(f"no such endpoint under model '{clip(name)}'")
    return name, version, rest[0] if rest else None


def _version_number(name: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 9:  # "²" and "٧" are digits to str.isdigit, not to int()
        raise VersionNotFound(name, text)
    return int(text)


class BodyBuffer:
    """The bytes of every request body being received at once, together, held under
    `max_bytes` (SERVING_MAX_BODY_BUFFER_BYTES). Each body may be up to
    SERVING_MAX_BODY_BYTES, and a client that sends most of one and then waits holds it
    for SERVING_BODY_TIMEOUT_S: an audit held 16 such 60 MB bodies and took the worker
    from 175 to 1,093 MiB. Past the buffer, a body is refused (503) before it is read
    on, and its connection keeps only what uvicorn buffers before it pauses reading.

    A body past `LARGE_BODY_BYTES` is only taken while the buffer is less than half full,
    so clients holding large bodies (8 of 64 MiB filled it) leave the other half to the
    usual small requests. What stops an anonymous client before its body is read at all
    is an API key (SERVING_API_KEYS=required): the key is checked from the headers."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.held = 0

    def take(self, more: int, body_size: int) -> None:
        """Take `more` bytes for a body that is `body_size` bytes with them."""
        self.check_room(more, body_size)
        self.held += more

    def check_room(self, more: int, body_size: int) -> None:
        """Refuse now a body the buffer has no room for, taking nothing: a declared length
        is refused from the headers when the buffer is already that full, before a client
        waiting for 100 Continue sends it."""
        limit = self.max_bytes if body_size <= LARGE_BODY_BYTES else self.max_bytes // 2
        if self.held + more > limit:
            raise BodyBufferFull(f"request bodies being received fill the worker's buffer ({self.max_bytes} bytes, "
                                 "SERVING_MAX_BODY_BUFFER_BYTES; a body over 1 MiB may use half); retry later")

    def give_back(self, size: int) -> None:
        self.held -= size


async def receive_body(receive, buffer: BodyBuffer, declared: int | None, limit: BodyLimit) -> bytes:
    """The whole body from the ASGI `receive`, refused past `limit` (a declared length
    before the first read) or when what has arrived of it does not fit in `buffer`, taken
    from the buffer as it arrives (a declared length only decides whether the body counts
    as large). The buffer is given back once the body is whole. Taking a declared length
    before its bytes came let headers alone hold the buffer: 2,800 connections declaring
    190 KB each, about 300 KB sent in all, had every other request refused."""
    if declared is not None and declared > limit.max_bytes:  # past a version's bound (the headers passed the global one)
        raise limit.too_large(f"body of {declared} bytes")
    if declared:
        buffer.check_room(declared, declared)
    taken = 0
    try:
        message = await receive()
        body = message.get("body", b"")
        if not message.get("more_body"):
            return _whole(message, body)
        chunks, size = [body], len(body)
        while True:
            if size > limit.max_bytes:
                raise limit.too_large("body")
            if size > taken:
                buffer.take(size - taken, declared or size)
                taken = size
            if not message.get("more_body"):
                return _whole(message, b"".join(chunks))
            message = await receive()
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
    finally:
        buffer.give_back(taken)


def _whole(last_message: dict, body: bytes) -> bytes:
    # A disconnect (or the body deadline, which closes the connection) ends the body early:
    # a partial body is never decoded, let alone enqueued.
    if last_message["type"] == "http.disconnect":
        raise ClientDisconnected("the client went away before its body arrived")
    return body
