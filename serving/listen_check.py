"""Whether this process could listen on an address, asked before anything starts.

uvicorn binds only after the application's start-up, and a worker's start-up loads its
models and reports to the console: on a taken port it joined the fleet, then died on the
bind, and the console listed a second worker at the URL of the one already there. The
probe binds as uvicorn does (SO_REUSEADDR: connections of a server stopped a moment ago
do not count) and lets go at once."""

from __future__ import annotations

import errno
import socket

TAKEN_HINT = "another process listens there (each worker needs a port of its own: --port)"


def listen_problem(host: str, port: int) -> OSError | None:
    """The error binding ``host:port`` gives now; None when it is free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # as uvloop binds "::": beside an IPv4 listener on the same port, not over it
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        probe.bind((host, port))
    except OSError as error:
        return error
    finally:
        probe.close()
    return None


def is_taken(error: OSError) -> bool:
    return error.errno == errno.EADDRINUSE


def is_not_here(error: OSError) -> bool:
    """``host`` names no address of this machine."""
    return isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL


def listen_refusal(host: str, port: int, error: OSError, taken_hint: str) -> str:
    if is_taken(error):
        return f"{host}:{port} is not free ({error.strerror}): {taken_hint}"
    hint = ": --host must name an address of this machine, e.g. 127.0.0.1, or 0.0.0.0 for all of them" if is_not_here(error) else ""
    return f"cannot listen on {host}:{port} ({error.strerror}){hint}"
