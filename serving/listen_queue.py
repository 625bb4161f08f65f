"""The listen queue's keeper: a new connection the event loop cannot take in time gets its
503 within milliseconds, and that refusal costs the event loop nothing.

Why: libuv (under uvloop) accepts one connection per pass of the event loop, and under
overload a pass takes milliseconds. New clients then wait in the kernel's listen queue,
full at thousands, for seconds, with their requests already sent (issue #9: 503s 7-8 s
late for an event-loop-bound model at 3x its capacity). Accepting faster in the loop was
measured to be worse: the loop then spent its time refusing, and served a sixth as much
(docs/reliability.md §2). The one-a-pass accept is the worker's admission control for new
connections; what was missing is a fast answer for those it will not take in time.

How: a small child process, ``python -m serving.listen_queue``, holds a duplicate of the
worker's listening socket, and the worker counts the connections it accepts and closes in
a shared page. While the queue is not empty the keeper looks at its length every TICK_S
(``TCP_INFO``: one syscall) and measures the pace at which the worker takes connections
from it while it is backlogged. The queue may hold (``room``) what the worker takes in
SERVING_ACCEPT_WAIT_S at that pace, at least KEEP_AT_LEAST; only SUSTAINED_WAIT_S of it
while arrivals keep outpacing the worker (a whole PACE_WINDOW_S, and still in the last
RECENT_S: an open-loop overload, which waiting will not clear, where a closed-loop
client's burst of connections arrives and stops), so past that short queue a refused
client waits milliseconds, not for the thousands queued before it; no more than the worker's
connection cap leaves room for (a connection past it would be refused by the loop, at
the loop's cost); and only KEEP_AT_LEAST while the worker says every routed version
refuses requests anyway (a new client would wait only to be refused). After a whole
PACE_WINDOW_S of refusing, the keeper stops refusing by pace (for RETURN_CHECK_S at most)
to see who still arrives: once the refused clients coming straight back (a closed loop:
wrk, most SDKs) have arrived, nobody more does, and if the queue then stays put for
RETURN_QUIET_S, a refusal was only another round trip for them: the pace bounds are
lifted until the queue grows again. If new clients kept arriving (an open-loop
overload), the next pause comes after four times as long: a pause delays the refusals of
those arriving in it. The keeper takes
the rest from the head of the queue (the connections that waited longest) and answers
each with 503, ``Retry-After: 1`` and ``Connection: close``. A burst the worker takes in
time is never refused: the pace rule refuses nothing before MIN_EVIDENCE_S of backlog has
shown the pace. An idle queue costs nothing: the keeper then sleeps until a connection
arrives.

The keeper runs at SERVING_KEEPER_NICE (5), so on a busy machine the loop, which serves,
gets the core before the keeper, which refuses. It reads at most READ_LIMIT bytes of a
refused request and never parses it; a refused connection whose request had not arrived
is kept half-closed until its client closes (``Lingering``), so the request that comes
after the 503 does not meet a reset. It ends when the worker does (the end of a pipe the
worker holds) or when asked to (the graceful stop, serving/drain.py, before the listener
closes: a keeper holding the listener would keep the port open). If it dies, the worker
logs it and goes on as before keepers existed. Linux only (``TCP_INFO`` on a listener,
``memfd``); elsewhere there is no keeper.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import mmap
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import orjson

from serving.logs import configure_logging, event

logger = logging.getLogger("serving.listen_queue")

TICK_S = 0.002  # how often a backlogged queue is looked at: 2 ms of arrivals at most go unanswered
PACE_WINDOW_S = 0.5  # the worker's accept pace is measured over this much of the backlog
MIN_EVIDENCE_S = 0.05  # no refusal before the backlog has lasted this long: a burst the loop takes in time passes
RECENT_S = 0.1  # arrivals still outpacing the worker this recently (and a window before) are a sustained overload
OUTPACE_FACTOR = 1.25  # arrivals at least this many times the accepts: clearly more than the worker takes
FEW_ARRIVALS = 16  # no more arrivals than this in a stretch is a trickle, not an overload, whatever the accepts
SUSTAINED_WAIT_S = 0.05  # under a sustained overload the queue holds this much of the pace: refusals come at once
KEEP_AT_LEAST = 16  # a slow or saturated worker keeps this many queued, so it sees when it has room again
RETURN_CHECK_S = 0.1  # the longest pause in refusing by pace, after a window of refusals, to see who still arrives
RETURN_QUIET_S = 0.02  # a stretch of the pause this long with no more than a trickle arriving: nobody new comes
RETURN_CHECK_BACK_OFF = 4  # new clients kept arriving: the next pause waits this many times as long as the last
RETURN_CHECK_MAX_EVERY_S = 8.0  # and no longer than this
READ_LIMIT = 64 * 1024  # what of a refused request is read (so the close is not a reset), never parsed
LOG_EVERY_S = 1.0
# Slots of the shared page: the keeper writes REFUSED, the worker the rest. ACCEPTED and
# CLOSED count the worker's connections on all its listeners (the cap is the worker's);
# ACCEPTED_HERE counts those taken from this keeper's listener, its queue's pace.
ACCEPTED, REFUSED, SATURATED, CLOSED, ACCEPTED_HERE = 0, 1, 2, 3, 4
WILDCARD_HOSTS = ("0.0.0.0", "::")
LINGER_S = 1.0  # how long a refused connection waits for its client to close
LINGER_TICK_S = 0.1
MAX_LINGERING = 4096
TCP_INFO_UNACKED = struct.Struct("8x6I")  # struct tcp_info: 8 u8, then rto, ato, snd_mss, rcv_mss, unacked, sacked
# The keeper sees only that the worker's loop does not take connections in time: an
# overload or a stall (a frozen process) look the same from here, and "overloaded" misled
# an operator whose worker was stopped.
REFUSAL_MESSAGE = "the worker cannot take this connection in time (overloaded or stalled); retry later"


def refusal_bytes() -> bytes:
    body = orjson.dumps({"error": REFUSAL_MESSAGE})
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"retry-after: 1\r\nconnection: close\r\n\r\n%s" % (len(body), body))


REFUSAL = refusal_bytes()
_DISCARD = bytearray(READ_LIMIT)
PROJECT_ROOT = Path(__file__).resolve().parent.parent  # where `-m serving.listen_queue` is found, whatever the cwd


def supported() -> bool:
    return sys.platform == "linux" and hasattr(socket, "TCP_INFO")


def queue_length(listener: socket.socket) -> int:
    """Connections the kernel completed that nobody has accepted yet (a listener's
    ``tcpi_unacked`` is its accept queue's length)."""
    info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_UNACKED.size)
    return TCP_INFO_UNACKED.unpack_from(info)[4]


def queue_capacity(listener: socket.socket) -> int:
    """How long the accept queue may grow (a listener's ``tcpi_sacked``: its backlog); past
    it the kernel drops new handshakes, and those arrivals cannot be seen."""
    info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_UNACKED.size)
    return TCP_INFO_UNACKED.unpack_from(info)[5]


class AcceptPace:
    """The pace at which the worker takes connections from its queue while the queue is
    backlogged (when it is empty, the arrivals set the pace, not the worker), and whether
    arrivals outpace it for longer than a burst lasts."""

    def __init__(self, window_s: float = PACE_WINDOW_S, evidence_s: float = MIN_EVIDENCE_S, capacity: int | None = None):
        self.window_s, self.evidence_s = window_s, evidence_s
        # A queue this close to its capacity hides arrivals (the kernel drops them): no sign of a closed loop.
        self._full_at = None if capacity is None else capacity - FEW_ARRIVALS
        self._samples: deque[tuple[float, int, int]] = deque()  # (time, accepted, arrived), arrived counting refusals
        self.sustained = False  # as of the last observation: see _outpaced_throughout
        self.returning = False  # the refused clients only came back: no bound by pace until the queue grows again
        self._refusing_since, self._last_refusal = 0.0, float("-inf")  # the current stretch of refusals
        self._check_after = window_s  # of refusals, before the next pause
        self._check_from: float | None = None  # while pausing to see who arrives: when the pause began
        self._lowest_queue = 0  # while returning: the shortest the queue has been since

    def observe(self, now: float, queued: int, accepted: int, refused: int = 0) -> None:
        if queued == 0:
            self._samples.clear()
            self.sustained = self.returning = False
            self._check_from, self._check_after = None, self.window_s
            return
        samples = self._samples
        samples.append((now, accepted, queued + accepted + refused))
        while len(samples) > 2 and now - samples[1][0] >= self.window_s:
            samples.popleft()
        full = self._full_at is not None and queued >= self._full_at
        if self._check_from is not None:
            self._look_during_check(now, queued, full)
        if self.returning:
            self._lowest_queue = min(self._lowest_queue, queued)
            self.returning = queued <= self._lowest_queue + FEW_ARRIVALS and not full  # new clients: the queue grows unrefused
            if not self.returning:  # the quiet stretch was a slow flood, not returning clients: look again later
                self._back_off()
        self.sustained = self._outpaced_throughout()

    def refused(self, now: float) -> None:
        """Some of the queue was just refused. After a whole window of refusals (none more
        than RECENT_S apart), refusing by pace pauses, for RETURN_CHECK_S at most (``checking``)."""
        if now - self._last_refusal > RECENT_S:
            self._refusing_since = now
        self._last_refusal = now
        if self._check_from is None and not self.returning and now - self._refusing_since >= self._check_after:
            self._check_from = now

    @property
    def checking(self) -> bool:
        return self._check_from is not None

    def _look_during_check(self, now: float, queued: int, full: bool) -> None:
        """Refused clients that come straight back arrive early in the pause, however busy
        the machine; after them only new clients arrive. A stretch of RETURN_QUIET_S in
        which arrivals outnumbered the accepts by no more than a trickle: refusing only
        spun the same clients round. None in RETURN_CHECK_S, or a queue that fills (the
        kernel would drop the next handshakes): new clients keep coming."""
        end, start = self._samples[-1], None
        for sample in reversed(self._samples):
            if sample[0] < self._check_from:
                break
            if end[0] - sample[0] >= RETURN_QUIET_S:
                start = sample
                break
        if start is not None and not full and (end[2] - start[2]) - (end[1] - start[1]) <= FEW_ARRIVALS:
            self.returning, self._lowest_queue = True, queued
        elif full or now - self._check_from >= RETURN_CHECK_S:  # full: more would be dropped unseen, not refused
            self._back_off()
        else:
            return
        self._check_from = None
        self._refusing_since = self._last_refusal = now  # a new window of refusals before the next pause

    def _back_off(self) -> None:
        self._check_after = min(RETURN_CHECK_BACK_OFF * self._check_after, RETURN_CHECK_MAX_EVERY_S)

    def per_second(self) -> float | None:
        """Accepts per second over the backlog's last window, or None before MIN_EVIDENCE_S of it."""
        if len(self._samples) < 2:
            return None
        (first_t, first_n, _), (last_t, last_n, _) = self._samples[0], self._samples[-1]
        span = last_t - first_t
        return (last_n - first_n) / span if span >= self.evidence_s else None

    def _outpaced_throughout(self) -> bool:
        """True when arrivals outpaced the worker by OUTPACE_FACTOR both in the last
        RECENT_S and in the rest of a whole window before it. A burst (a closed-loop client
        opening its connections) arrives and stops: the recent part shows it stopped, and its
        connections may wait their full time. Arrivals that go on are an overload that
        waiting will not clear: those past a short queue are refused as they come."""
        samples = self._samples
        if len(samples) < 3 or samples[-1][0] - samples[0][0] < self.window_s * 0.9:
            return False
        last = samples[-1]
        split = len(samples) - 2  # the latest sample at least RECENT_S before the last
        while split > 0 and last[0] - samples[split][0] < RECENT_S:
            split -= 1
        return split > 0 and _outpaced(samples[0], samples[split]) and _outpaced(samples[split], last)

    def may_wait(self, wait_s: float) -> int | None:
        """How many connections the queue may hold: what the worker takes in ``wait_s``, or in
        SUSTAINED_WAIT_S while arrivals keep outpacing it; any (None) before the pace is
        known, while refusing pauses to see who arrives, and while refused clients only
        come back."""
        pace = self.per_second()
        if pace is None or self.returning or self.checking:
            return None
        return max(KEEP_AT_LEAST, int(pace * (min(wait_s, SUSTAINED_WAIT_S) if self.sustained else wait_s)))


def _outpaced(start: tuple[float, int, int], end: tuple[float, int, int]) -> bool:
    accepted, arrived = end[1] - start[1], end[2] - start[2]
    return arrived > FEW_ARRIVALS and arrived >= OUTPACE_FACTOR * accepted


def room(pace: AcceptPace, wait_s: float, saturated: bool, open_slots: int | None = None) -> int | None:
    """How many connections the queue may hold now (None: any, no evidence yet). A worker
    that refuses every request would only refuse them after their wait: a few stay
    queued, so the worker sees when it has room again. ``open_slots`` is what the
    worker's connection cap leaves (None: no cap): a connection past it would be refused
    by the event loop, at the loop's cost."""
    allowed = KEEP_AT_LEAST if saturated else pace.may_wait(wait_s)
    if open_slots is None:
        return allowed
    return max(open_slots, 0) if allowed is None else min(allowed, max(open_slots, 0))


class Lingering:
    """Refused connections whose write side is shut, kept open until their client closes
    (or LINGER_S): a request that arrives after the 503 is then read and dropped, where a
    closed socket would answer it with a reset, and a client that sees the reset first
    loses the 503 it had not read yet. At most ``limit``; past it the oldest closes, so
    clients that never close cannot hold the keeper's files."""

    def __init__(self, limit: int = MAX_LINGERING) -> None:
        self.limit = limit
        self._epoll = select.epoll()
        self._open: dict[int, socket.socket] = {}
        self._order: deque[tuple[float, int, socket.socket]] = deque()  # (close by, fd, socket), oldest first

    def fileno(self) -> int:
        return self._epoll.fileno()

    def __len__(self) -> int:
        return len(self._open)

    def add(self, connection: socket.socket, now: float) -> None:
        fd = connection.fileno()
        try:
            connection.shutdown(socket.SHUT_WR)  # the 503, then end of file
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP)
        except OSError:  # the client is gone already
            connection.close()
            return
        self._open[fd] = connection
        self._order.append((now + LINGER_S, fd, connection))
        while len(self._open) > self.limit:
            self._close_oldest()

    def service(self) -> None:
        """Read and drop what clients sent; close those that closed."""
        for fd, _ in self._epoll.poll(0):
            connection = self._open.get(fd)
            if connection is None:
                continue
            try:
                received = connection.recv_into(_DISCARD, READ_LIMIT, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                received = 0
            if received == 0:
                self._close(fd)

    def expire(self, now: float) -> None:
        order = self._order
        while order:
            close_by, fd, connection = order[0]
            if self._open.get(fd) is connection and close_by > now:
                break
            self._close_oldest()  # past its time, or closed by its client already

    def _close_oldest(self) -> None:
        _, fd, connection = self._order.popleft()
        if self._open.get(fd) is connection:
            self._close(fd)

    def _close(self, fd: int) -> None:
        connection = self._open.pop(fd)
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(fd)
        connection.close()


def refuse(listener: socket.socket, count: int, lingering: Lingering | None = None, answer: bytes = REFUSAL) -> int:
    """Take up to ``count`` connections from the head of the queue and answer each 503.
    Returns how many were refused (fewer when the worker took the rest meanwhile)."""
    refused, now = 0, time.monotonic()
    for _ in range(count):
        try:
            connection, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            break
        except OSError:  # out of files, a connection reset in the queue: the next tick tries again
            break
        try:
            arrived = connection.recv_into(_DISCARD, READ_LIMIT, socket.MSG_DONTWAIT)  # a close with unread data resets
        except OSError:
            arrived = 0
        try:
            connection.send(answer, socket.MSG_DONTWAIT)
        except OSError:
            arrived = -1
        # What arrived so far says nothing of what is still coming (an upload sends for
        # longer than a tick): close once its client has read the 503 and closed, since a
        # close with bytes unread is a reset that fails the client's send before it reads.
        if lingering is None or arrived == -1:  # gone: nothing to wait for
            connection.close()
        else:
            lingering.add(connection, now)
        refused += 1
    return refused


def keep(listener: socket.socket, counters: memoryview, parent_fd: int, wait_s: float, max_connections: int = 0) -> None:
    """The keeper's loop, until ``parent_fd`` reads end of file."""
    listener.setblocking(False)
    lingering = Lingering()
    polls = {}
    for watch_listener in (True, False):
        poll = polls[watch_listener] = select.poll()
        poll.register(parent_fd, select.POLLIN)
        poll.register(lingering.fileno(), select.POLLIN)
        if watch_listener:
            poll.register(listener.fileno(), select.POLLIN)
    pace, queued = AcceptPace(capacity=queue_capacity(listener)), 0
    report = RefusalLog()
    while True:
        if queued:  # backlogged: the listener is readable all along, look again in a tick
            ready = polls[False].poll(TICK_S * 1000)
        else:  # asleep until a connection arrives, but lingering connections and a pending log line have their times
            ready = polls[True].poll(LINGER_TICK_S * 1000 if len(lingering) or report.refused else None)
        if any(fd == parent_fd for fd, _ in ready):
            report.flush(force=True)
            return
        lingering.service()
        queued, now = queue_length(listener), time.monotonic()
        lingering.expire(now)
        returning = pace.returning
        pace.observe(now, queued, counters[ACCEPTED_HERE], counters[REFUSED])
        if pace.returning != returning and queued:
            logger.warning(event("refused_clients_return" if pace.returning else "new_clients_arrive", queued=queued,
                                 refusing_by_pace=not pace.returning))
        open_slots = max_connections - (counters[ACCEPTED] - counters[CLOSED]) if max_connections else None
        may_wait = room(pace, wait_s, bool(counters[SATURATED]), open_slots)
        if may_wait is not None and queued > may_wait:
            refused = refuse(listener, queued - may_wait, lingering)
            counters[REFUSED] += refused
            if refused:
                pace.refused(now)
            report.add(refused, queued, pace.per_second(), bool(counters[SATURATED]), pace.sustained)
            queued -= refused
        report.flush()


class RefusalLog:
    """At most one line a second while refusing: how many, how long the queue was, the pace."""

    def __init__(self) -> None:
        self.refused, self.longest, self.pace, self.since = 0, 0, 0.0, time.monotonic()
        self.saturated = self.sustained = False

    def add(self, refused: int, queued: int, pace: float | None, saturated: bool, sustained: bool) -> None:
        if not self.refused:
            self.since = time.monotonic()
        self.refused += refused
        self.longest = max(self.longest, queued)
        self.pace = pace or 0.0
        self.saturated = self.saturated or saturated
        self.sustained = self.sustained or sustained

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.refused and (force or now - self.since >= LOG_EVERY_S):
            logger.warning(event("new_connections_refused", refused=self.refused, seconds=round(now - self.since, 3),
                                 longest_queue=self.longest, worker_accepts_per_s=round(self.pace, 1),
                                 worker_refusing_every_request=self.saturated, arrivals_outpacing_worker=self.sustained))
            self.refused, self.longest, self.saturated, self.sustained = 0, 0, False, False


class Keeper:
    """The worker's side: the shared counters, the child process, and how to stop it."""

    def __init__(self, process: subprocess.Popen, counters: memoryview, stop_fd: int, shared: mmap.mmap, host: str = ""):
        self.process, self.counters, self._stop_fd, self._shared = process, counters, stop_fd, shared
        self.host = host  # the address its listener is bound to
        self._reported_death = False

    @classmethod
    def start(cls, listener: socket.socket, wait_s: float, log_level: str = "info", max_connections: int = 0,
              nice: int = 0) -> Keeper | None:
        """A keeper for ``listener``, or None where there can be none (not Linux, turned off)."""
        if wait_s <= 0 or not supported() or listener.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        try:
            counter_fd = os.memfd_create("modelops-listen-queue")
        except OSError as exc:
            logger.error(event("listen_queue_keeper_not_started", reason=str(exc)))
            return None
        read_end, stop_fd = os.pipe()
        try:
            os.ftruncate(counter_fd, mmap.PAGESIZE)
            shared = mmap.mmap(counter_fd, mmap.PAGESIZE)
            process = subprocess.Popen(
                [sys.executable, "-m", "serving.listen_queue", "--listener-fd", str(listener.fileno()),
                 "--counters-fd", str(counter_fd), "--parent-fd", str(read_end), "--wait-s", repr(wait_s),
                 "--max-connections", str(max_connections), "--nice", str(nice), "--log-level", log_level],
                pass_fds=(listener.fileno(), counter_fd, read_end), stdin=subprocess.DEVNULL, cwd=PROJECT_ROOT)
        except OSError as exc:  # no process to be had: the worker serves as it did before keepers
            os.close(stop_fd)
            logger.error(event("listen_queue_keeper_not_started", reason=str(exc)))
            return None
        finally:
            os.close(read_end)
            os.close(counter_fd)
        return cls(process, memoryview(shared).cast("Q"), stop_fd, shared, listener.getsockname()[0])

    def accepted(self, here: bool = True) -> None:
        """The worker took a connection: from this keeper's listener when ``here``."""
        self.counters[ACCEPTED] += 1
        if here:
            self.counters[ACCEPTED_HERE] += 1

    def listens_on(self, local_address: tuple | None) -> bool:
        """Whether a connection whose local end is ``local_address`` came through this listener."""
        if not local_address:
            return False
        host = local_address[0]
        if self.host in WILDCARD_HOSTS:  # one wildcard listener a family: tell the families apart
            return (":" in host) == (":" in self.host)
        return host == self.host

    def closed(self) -> None:
        self.counters[CLOSED] += 1

    @property
    def refused(self) -> int:
        return self.counters[REFUSED]

    def alive(self) -> bool:
        """False once the keeper has died on its own (logged once): the worker goes on without it."""
        status = self.process.poll()
        if status is not None and self._stop_fd >= 0 and not self._reported_death:
            self._reported_death = True
            logger.error(event("listen_queue_keeper_died", status=status,
                               consequence="new connections wait for the event loop to take them"))
        return status is None

    def stop(self, timeout_s: float = 2.0) -> None:
        """End the keeper and wait for it: once this returns, it holds the listener no more."""
        if self._stop_fd < 0:
            return
        os.close(self._stop_fd)
        self._stop_fd = -1
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Keepers:
    """Every keeper of one worker: one per listening socket, started once uvicorn listens.
    Shared by the HTTP protocol (which counts accepts) and the server (which stops them)."""

    def __init__(self, wait_s: float = 0.0, log_level: str = "info", refuses_everything: Callable[[], bool] | None = None,
                 nice: int = 0):
        self.wait_s, self.log_level, self.nice = wait_s, log_level, nice
        self.refuses_everything = refuses_everything  # the worker's own admission, asked every tick of its loop
        self.max_connections = 0  # the HTTP protocol's cap once fitted to the open-file limit (0: none)
        self._keepers: list[Keeper] = []

    def start(self, listeners) -> None:
        for listener in listeners:
            keeper = Keeper.start(listener, self.wait_s, self.log_level, self.max_connections, self.nice)
            if keeper is not None:
                self._keepers.append(keeper)
        if self._keepers:
            logger.info(event("listen_queue_kept", keepers=len(self._keepers), wait_s=self.wait_s,
                              pids=[keeper.process.pid for keeper in self._keepers]))

    def accepted(self, local_address: tuple | None = None) -> None:
        """The worker took a connection whose local end is ``local_address``: each keeper
        counts it as open, and the one whose listener it came through counts it in its
        pace. A host name with IPv4 and IPv6 addresses gives a worker two listeners, and
        one queue's pace must not count what the other's loop took."""
        if len(self._keepers) <= 1:  # the usual one listener (or none): no address to match
            for keeper in self._keepers:
                keeper.accepted()
            return
        here = [keeper.listens_on(local_address) for keeper in self._keepers]
        if not any(here):  # no address to go by: counted in every pace, as refusing what could wait is worse
            here = [True] * len(here)
        for keeper, its_own in zip(self._keepers, here):
            keeper.accepted(here=its_own)

    def closed(self) -> None:
        for keeper in self._keepers:
            keeper.closed()

    @property
    def refused(self) -> int:
        return sum(keeper.refused for keeper in self._keepers)

    def check(self) -> None:
        """Tell the keepers whether the worker now refuses every request it could be sent
        (they then keep only KEEP_AT_LEAST queued: a new client would wait only to be
        refused), and log a keeper that died."""
        if not self._keepers:
            return
        saturated = int(bool(self.refuses_everything and self.refuses_everything()))
        for keeper in self._keepers:
            keeper.counters[SATURATED] = saturated
            keeper.alive()

    def stop(self) -> None:
        for keeper in self._keepers:
            keeper.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serving.listen_queue", description=__doc__.splitlines()[0])
    parser.add_argument("--listener-fd", type=int, required=True)
    parser.add_argument("--counters-fd", type=int, required=True)
    parser.add_argument("--parent-fd", type=int, required=True)
    parser.add_argument("--wait-s", type=float, required=True)
    parser.add_argument("--max-connections", type=int, default=0)
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    if args.nice > 0:  # serving beats refusing: on a busy machine the event loop gets the core first
        os.nice(args.nice)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the worker too: the worker stops us in order
    with socket.socket(fileno=args.listener_fd) as listener:
        shared = mmap.mmap(args.counters_fd, mmap.PAGESIZE)
        os.close(args.counters_fd)
        keep(listener, memoryview(shared).cast("Q"), args.parent_fd, args.wait_s, args.max_connections)


if __name__ == "__main__":
    main()
