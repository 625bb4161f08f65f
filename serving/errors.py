"""One exception class per failure, each mapped to one HTTP status, here and only here.

The ASGI app turns any ServingError into `{"error": message}` with `status` and
`headers`; anything else becomes InternalError (500, request id, no stack trace).
"""

from __future__ import annotations

import orjson

CLIENT_TEXT_CHARS = 80  # at most this much of anything a client sent goes into an error
MAX_MESSAGE_CHARS = 400  # and no error message is longer than this, whatever it quotes


def clip(value: object) -> str:
    """A short prefix of client input, for error messages (never the whole thing)."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= CLIENT_TEXT_CHARS else text[:CLIENT_TEXT_CHARS] + "…"


class ServingError(Exception):
    status = 500
    headers: tuple[tuple[bytes, bytes], ...] = ()
    version = None  # the loaded version the request had reached, for its metrics

    def __init__(self, message: str):
        if len(message) > MAX_MESSAGE_CHARS:  # a safety net behind clip()
            message = message[:MAX_MESSAGE_CHARS] + "…"
        super().__init__(message)
        self.message = message

    def body(self) -> bytes:
        return orjson.dumps({"error": self.message})


class BadRequest(ServingError):
    """The request is malformed or does not match the model's signature."""

    status = 400


class AnswerTooLarge(BadRequest):
    """The answer is larger than the worker holds for a client (SERVING_MAX_UNSENT_BYTES).
    Written whole, its writes paused holding all of it and the connection was cut as a
    client not reading: a 200 whose body ended early (a 60-byte request for 3e7 values got
    4 MB of a 618 MB body). Sent a slice at a time instead, it was held by the app, outside
    that bound, for as long as a client read a little every few seconds. Refused whole."""


class Unauthorized(ServingError):
    """No valid API key (inference) or worker token (/metrics, /health) where one is needed."""

    status = 401
    headers = ((b"www-authenticate", b'Bearer realm="modelops-serving"'),)


class PayloadTooLarge(ServingError):
    status = 413


class UnsupportedMediaType(ServingError):
    """A body labelled neither JSON nor application/octet-stream."""

    status = 415


class ClientDisconnected(ServingError):
    """The client went away (or its body deadline passed) before the body arrived; nothing
    is computed and nothing can be answered. 499 as nginx counts it, for the metrics."""

    status = 499


class NotFound(ServingError):
    """No such endpoint."""

    status = 404


class MethodNotAllowed(ServingError):
    status = 405


class ModelNotFound(NotFound):
    def __init__(self, model_name: str):
        super().__init__(f"unknown model '{clip(model_name)}'")


class VersionNotFound(NotFound):
    def __init__(self, model_name: str, version: object):
        super().__init__(f"model '{clip(model_name)}' has no loaded version '{clip(str(version))}': "
                         "a worker loads only what the console routes")


class NotReady(ServingError):
    """The worker or version is loading, draining or has nothing routed."""

    status = 503
    headers = ((b"retry-after", b"1"),)


class QueueFull(ServingError):
    """Overload: the queue is full, or the request could not make its deadline."""

    status = 503
    headers = ((b"retry-after", b"1"),)


class BodyBufferFull(ServingError):
    """Every body being received at once, together, would pass SERVING_MAX_BODY_BUFFER_BYTES."""

    status = 503
    headers = ((b"retry-after", b"1"),)


class RunMemoryBusy(ServingError):
    """A run found the worker's capped run memory held by other runs (serving/run_memory.py)."""

    status = 503
    headers = ((b"retry-after", b"1"),)


class DeadlineExceeded(ServingError):
    status = 504
    # The deadline missed, or predicted to be (monotonic clock), set where it was judged:
    # whose deadline it was decides whether the 504 is a failure of the worker's.
    deadline_s: float | None = None

    def __init__(self, message: str = "deadline exceeded before the request was computed"):
        super().__init__(message)

    def missed_clients_deadline(self, server_deadline_s: float) -> bool:
        """Whether the deadline missed is one the client set shorter than the worker's own
        (X-Request-Timeout-S, parameters.timeout): answered 504 all the same, but a client
        that asks the impossible of itself makes no version, and no drill, look failed."""
        return self.deadline_s is not None and self.deadline_s < server_deadline_s


class InternalError(ServingError):
    """Our own failure: the client gets the request id, the log gets the details."""

    status = 500

    def __init__(self, request_id: str):
        super().__init__(f"internal error (request id {request_id})")


class ModelFailed(ServingError):
    """ONNX Runtime refused a batch; every request in that batch gets this."""

    status = 500


class LoadError(Exception):
    """A version could not be fetched, verified, loaded or warmed (not an HTTP error)."""
