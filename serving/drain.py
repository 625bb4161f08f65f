"""Graceful stop of a worker: on SIGTERM (or SIGINT) no accepted request is dropped.

1. At the signal the worker turns not ready (``/v2/health/ready`` and every model's
   ``ready`` answer 503 ``{"ready": false, "draining": true}``) and its control plane
   reports ``state: "draining"``, but it goes on accepting and serving for
   SERVING_DRAIN_DELAY_S: a load balancer, or Kubernetes' endpoints controller, takes
   it out of rotation meanwhile, and sending it a request still works. The answer to
   the last request each connection has sent from now on carries ``Connection: close``
   (those it pipelined before are answered first), so keep-alive clients reconnect, and
   their new connections go where the balancer now sends them.
2. Then it stops accepting (uvicorn's ``Server.shutdown``): a socket filter stops new
   handshakes, the connections the kernel had already completed are taken in (closing
   the listener would reset them), the listener closes,
   an idle keep-alive connection is closed, a request in progress finishes with
   ``Connection: close``, and one still arriving is let in. Everything accepted, queued
   in the batchers included, gets its answer within SERVING_DRAIN_TIMEOUT_S; what is left
   past it gets a 503 straight from the protocol, counted in the log.
3. Only then the lifespan shutdown runs: the control plane sends a last report,
   ``state: "stopped"`` (the console shows the worker stopped at once, not gone), and
   the repository and its batchers close. Exit status 0 when nothing was cut, 1 when the
   timeout cut requests.

A second signal during the drain ends it at once (uvicorn's force exit): what is still
open gets its 503, no lifespan shutdown runs, and the process ends by that signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import struct
import sys
import time
from types import FrameType

import uvicorn

from serving import metrics
from serving.listen_queue import Keepers
from serving.logs import event

logger = logging.getLogger("serving.drain")
SERVING, DRAINING, STOPPED = "serving", "draining", "stopped"
POLL_S = 0.05  # how often the drain looks whether everything was answered
SO_ATTACH_FILTER, BPF_RET_K = 26, 0x06  # <asm-generic/socket.h>, <linux/bpf_common.h>: BPF_RET | BPF_K
CUT_MESSAGE = "the worker stopped before this request was answered; retry it"


class Drain:
    """The phase of the stop, read by the app (readiness), the HTTP protocol (keep-alive)
    and the control plane (reports). Set from a signal handler: plain attributes only."""

    def __init__(self, delay_s: float = 0.0, timeout_s: float = 20.0):
        self.delay_s, self.timeout_s = delay_s, timeout_s
        self.phase = SERVING
        self.began_at: float | None = None  # time.monotonic() of the signal
        self.signal: int | None = None
        self._changed: asyncio.Event | None = None

    @property
    def is_draining(self) -> bool:
        return self.phase != SERVING

    def begin(self, sig: int | None = None) -> None:
        if self.phase == SERVING:
            self.phase, self.began_at, self.signal = DRAINING, time.monotonic(), sig

    def stopped(self) -> None:
        self.phase = STOPPED
        self.announce()

    def announce(self) -> None:
        """Wake whoever waits in ``changes_within`` (from the event loop, never a signal handler)."""
        if self._changed is not None:
            self._changed.set()

    async def changes_within(self, timeout_s: float) -> None:
        """Sleep ``timeout_s``, or less when the phase is announced to have changed meanwhile."""
        self._changed = self._changed or asyncio.Event()
        self._changed.clear()
        # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that
        # meets the event being set, and the control plane's stop() then waits forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the stop above: its signal capture, main loop, connection
    ``shutdown()`` and task wait, with a delay before and a 503 for what the bound cuts."""

    def __init__(self, config: uvicorn.Config, drain: Drain, keepers: Keepers | None = None):
        super().__init__(config)
        self.drain = drain
        self.keepers = keepers or Keepers()
        self.exit_status = 0
        self._announced = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:  # listening now: the keepers take what the loop cannot take in time
            self.keepers.start([listener for server in self.servers for listener in server.sockets or ()])

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.is_draining or self.should_exit:  # the second signal: stop now
            self._captured_signals.append(sig)  # re-raised once serving ends: the process ends by it
            self.force_exit = self.should_exit = True
            return
        self.drain.begin(sig)

    async def on_tick(self, counter: int) -> bool:
        drain = self.drain
        if not drain.is_draining:
            self.keepers.check()
        metrics.count_refused_connections(self.keepers.refused)
        if drain.is_draining and not self._announced:
            self._announced = True
            logger.warning(event("drain_started", signal=_signal_name(drain.signal), delay_s=drain.delay_s, timeout_s=drain.timeout_s,
                                 connections=len(self.server_state.connections), in_flight=len(self.server_state.tasks)))
            drain.announce()
        if drain.is_draining and time.monotonic() - drain.began_at >= drain.delay_s:
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.drain.begin()  # stopped by other means than a signal (max requests): drain all the same
        answered_before, stopped_at = self.server_state.total_requests, time.monotonic()
        self.keepers.stop()  # a keeper holds the listener too: it would keep the port open after the close
        metrics.count_refused_connections(self.keepers.refused)  # its refusals since the last tick, for the final report
        taken = self._take_backlog()
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        await asyncio.gather(*taken, return_exceptions=True)
        for connection in list(self.server_state.connections):
            connection.shutdown()
        logger.warning(event("stopped_accepting", connections=len(self.server_state.connections),
                             in_flight=len(self.server_state.tasks), taken_from_backlog=len(taken)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._answers_sent(), timeout=self.drain.timeout_s)
        cut = self._cut_what_is_left()
        self.drain.stopped()
        logger.warning(event("drained", answered=self.server_state.total_requests - answered_before, cut=cut,
                             waited_s=round(time.monotonic() - stopped_at, 3), forced=self.force_exit))
        if cut:
            self.exit_status = 1
        if not self.force_exit:
            await self.lifespan.shutdown()
            self._captured_signals.clear()  # a clean stop exits with its status, not by re-raising the signal
        logger.warning(event("worker_exit", status=self.exit_status if not self.force_exit else "by signal", forced=self.force_exit))

    async def _answers_sent(self) -> None:
        # uvicorn's _wait_tasks_to_complete, without its wait_closed(): the connections
        # taken from the backlog belong to no listener, and a forced stop must not wait.
        while (self.server_state.connections or self.server_state.tasks) and not self.force_exit:
            await asyncio.sleep(POLL_S)

    def _take_backlog(self) -> list:
        """Connections the kernel completed that the loop has not accepted yet: closing the
        listener would reset them, though their clients have sent their requests."""
        loop, pending = asyncio.get_running_loop(), []
        for server in self.servers:
            for listener in server.sockets or ():
                with socket.socket(fileno=os.dup(listener.fileno())) as accepting:
                    complete_no_more_handshakes(accepting)
                    accepting.setblocking(False)
                    while True:
                        try:
                            connection, _ = accepting.accept()
                        except (BlockingIOError, InterruptedError):
                            break
                        connection.setblocking(False)
                        pending.append(loop.connect_accepted_socket(self._new_protocol, connection))
        return pending

    def _new_protocol(self) -> asyncio.Protocol:
        return self.config.http_protocol_class(config=self.config, server_state=self.server_state, app_state=self.lifespan.state)

    def _cut_what_is_left(self) -> int:
        """Past the bound (or forced): a 503 to every request not answered yet, then uvicorn's
        cancellation of the tasks left. Returns how many requests were cut."""
        cut = sum(connection.cut(CUT_MESSAGE) for connection in list(self.server_state.connections))
        if cut or self.server_state.tasks:
            logger.error(event("drain_cut", requests=cut, tasks=len(self.server_state.tasks), timeout_s=self.drain.timeout_s,
                               forced=self.force_exit))
        for task in self.server_state.tasks:
            task.cancel(msg="cut: graceful stop timeout exceeded")
        return cut


def complete_no_more_handshakes(listener: socket.socket) -> None:
    """Drop every packet that reaches ``listener`` from now on (a socket filter: Linux
    only): no handshake completes into its backlog any more, so the backlog taken next is
    everything the kernel accepted, even when this process is preempted before the
    listener closes. A client whose SYN is dropped retries it and then meets the closed
    port: refused, never reset after its connect succeeded."""
    if sys.platform != "linux":
        return
    program = ctypes.create_string_buffer(struct.pack("HBBI", BPF_RET_K, 0, 0, 0))  # return 0: keep nothing
    with contextlib.suppress(OSError):  # without a filter the window is the few microseconds to the close
        listener.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, struct.pack("HL", 1, ctypes.addressof(program)))


def _signal_name(sig: int | None) -> str | None:
    return signal.Signals(sig).name if sig is not None else None
