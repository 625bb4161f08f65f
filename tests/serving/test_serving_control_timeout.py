"""The control plane's calls to the console give up after SERVING_CONSOLE_TIMEOUT_S, the
same timeout as every other call a worker makes to the console."""

from __future__ import annotations

import asyncio
import time

from serving.control import ControlPlane
from serving.worker import Worker
from serving_testkit import make_config


async def _silent_console() -> tuple[asyncio.Server, str]:
    """A console that accepts connections, reads the request and never answers."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up and closes
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_console_that_never_answers_is_given_up_on_after_the_configured_timeout(tmp_path):
    server, url = await _silent_console()
    worker = Worker(make_config(tmp_path, worker_token="t", console_url=url, console_timeout_s=0.3))
    plane = ControlPlane(worker, redis_url="", public_url="http://127.0.0.1:1")
    await plane.start(run_loops=False)
    try:
        started = time.monotonic()
        result = await asyncio.wait_for(plane.reconcile(), timeout=10)
        elapsed_s = time.monotonic() - started
    finally:
        await plane.stop()
        await worker.close()
        server.close()

    assert result is None
    assert 0.3 <= elapsed_s < 2.0, f"gave up after {elapsed_s:.2f} s"
