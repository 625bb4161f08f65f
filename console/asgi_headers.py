"""Reading a header off an ASGI scope, for the middleware that decides before Django runs
(console/body_limit.py, console/socket_origin.py)."""

from __future__ import annotations


def header(headers, wanted: bytes) -> str | None:
    """The first header named ``wanted`` (lower-case bytes, as ASGI gives names), decoded."""
    for name, value in headers:
        if name == wanted:
            return value.decode("latin-1")
    return None
