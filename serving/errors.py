"""One exception class per failure, each mapped to one HTTP status, here and only here.

The ASGI app turns any ServingError into `{"error": message}` with `status` and
`headers`; anything else becomes InternalError (500, request id, no stack trace).
"""

from __future__ import annotations

import orjson


class ServingError(Exception):
    status = 500
    headers: tuple[tuple[bytes, bytes], ...] = ()
    version = None  # the loaded version the request had reached, for its metrics

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def body(self) -> bytes:
        return orjson.dumps({"error": self.message})


class BadRequest(ServingError):
    """The request is malformed or does not match the model's signature."""

    status = 400


class PayloadTooLarge(ServingError):
    status = 413


class NotFound(ServingError):
    """No such endpoint."""

    status = 404


class MethodNotAllowed(ServingError):
    status = 405


class ModelNotFound(NotFound):
    def __init__(self, model_name: str):
        super().__init__(f"unknown model '{model_name}'")


class VersionNotFound(NotFound):
    def __init__(self, model_name: str, version: object):
        super().__init__(f"model '{model_name}' has no loaded version '{version}'")


class NotReady(ServingError):
    """The worker or version is loading, draining or has nothing routed."""

    status = 503
    headers = ((b"retry-after", b"1"),)


class QueueFull(ServingError):
    """Overload: the queue is full, or the request could not make its deadline."""

    status = 503
    headers = ((b"retry-after", b"1"),)


class DeadlineExceeded(ServingError):
    status = 504

    def __init__(self, message: str = "deadline exceeded before the request was computed"):
        super().__init__(message)


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
