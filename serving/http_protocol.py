"""uvicorn's httptools protocol, guarded against slow and oversized clients, with each
response leaving in one socket write.

Guards (`HttpLimits`, from SERVING_HEADER_TIMEOUT_S, SERVING_BODY_TIMEOUT_S,
SERVING_MAX_HEADER_BYTES, SERVING_MAX_CONNECTIONS, SERVING_SEND_TIMEOUT_S): uvicorn bounds
neither how long headers or a body may take to arrive nor their size, so a client that
declares a length and never sends it held its connection and its in-flight slot forever.
Nor how long an answer may wait for its client to read it: a client that pipelined and
never read held its connection for good (64 of them held every slot of the cap). Here a
connection whose writes stay paused, the client taking nothing, past the send deadline is
cut (an abort: there is no answer to give a client that does not read). Here a
connection past its deadline gets 408, and the ASGI app's `receive()` returns
`http.disconnect`, so the request is dropped and its slot freed; headers past the cap
get 431, a request the parser rejects 400, a transfer coding other than chunked 501
(httptools framed ``gzip, chunked`` as plain chunked and handed on a body still gzipped;
RFC 9112 §6.1), a connection beyond the cap 503; each of these refusals ends with a
lingering close (below). The deadline timer is armed only when a
chunk leaves headers or body incomplete, so a request that arrives in one read costs no
timer.

Pipelining: a client may send its next requests before reading the answers. uvicorn
parses every request in each chunk it reads, queues them, and read on after every answer,
so a client that pipelined and never read grew the worker's memory without bound (an
audit: 93 MB to 2.4 GB in 14 s on four connections). Here reading resumes only once the
queue is empty, and a chunk that would queue more than MAX_PIPELINED requests ends the
connection (the requests it carried are dropped unanswered, as on a disconnect).

A request answered before its body was read (a 413 from the headers, an overload 503)
while its client waits for `100 Continue` leaves its connection out of step: uvicorn kept
it alive, so a client that, as RFC 9110 allows, skipped the body and sent its next request
had that request read as the body, and hung until the body deadline. Such an answer, and
one given before a body larger than UNREAD_BODY_READ_UP_TO (read only to be dropped), now
carries `Connection: close`, and the connection ends with a lingering close (RFC 9112
§9.6): the answer, then end of file, then what the client still sends read and dropped
until it closes (or LINGER_QUIET_S of silence, LINGER_MAX_S in all), so the answer is not
lost to a reset. Any other body the answer came before is read on and dropped, and the
connection kept. Only a request whose body is still arriving at the end of a read is
looked at; one that arrives in one read costs nothing. The protocol's own refusals are
given while their client may still be sending: the cap's 503 before anything is read, a
408 to a slow upload, a 431 to a header still streaming, a 400 before whatever follows
what the parser rejected. They end with the same lingering close (a plain close with
bytes unread was a reset, and the client's send failed before it read the answer), unless
MAX_LINGERING_REFUSALS, counted together, already linger. A lingering refusal holds no
slot of the connection cap, and a graceful stop closes it at once.

Graceful stop (serving/drain.py): while draining, only the newest request a connection
has sent is answered with `Connection: close`; the ones before it, pipelined, keep their
keep-alive, so every request read is answered before the connection closes. (Marking
each one made the first answer close the connection and dropped the queue behind it.)

Coalescing: uvicorn writes a response's head (`http.response.start`) and body with one
`transport.write` each: two send syscalls and two loopback segments per request. Holding
the writes made during one event-loop iteration and joining them halves that; measured
on the 2-core box with `bench/http_ceiling.py` (a bare ASGI handler, 64 connections):
16.3k → 21.8k req/s. The wrapper changes nothing else: every other transport call,
flow control included, goes straight through.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct
import termios
import time
from dataclasses import dataclass, replace

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from serving import metrics
from serving.drain import Drain
from serving.errors import clip
from serving.listen_queue import Keepers
from serving.logs import event

logger = logging.getLogger("serving.http")
# On a graceful stop, how long a connection accepted just before the listener closed may
# take to send its first request: a client writes right after connecting.
FIRST_REQUEST_GRACE_S = 1.0
# Requests one connection may have waiting behind the one being answered. Clients that
# pipeline at all (few do) send a handful; past this, a connection is hanging up on, not served.
MAX_PIPELINED = 32
# A lingering close: how long the client may stay silent, and how long in all, before the
# connection closes for good (the client normally closes first, having read the answer).
LINGER_QUIET_S = 1.0
LINGER_MAX_S = 5.0
# A body left unread by an answer given before it arrived is read on and dropped, keeping
# the connection, up to this size; a larger one ends the connection instead.
UNREAD_BODY_READ_UP_TO = 64 * 1024
# Refused connections (the cap's 503; 400, 408, 431) that may linger at once; past this, a
# refusal closes at once (a reset if its client was sending), so that clients that never
# close cannot take the open files the cap leaves for models, logs and the console.
# One budget for every kind, not a sibling cap per kind: a lingering refusal holds no slot
# of the cap, so each takes an open file from the same FILES_BESIDES_CONNECTIONS, and a
# second cap would double what refusals may take. A flood of cheap 400s can fill it: that
# costs the clients refused meanwhile their lingering (the close at once they had before),
# never the worker its files.
MAX_LINGERING_REFUSALS = 64


@dataclass(frozen=True, slots=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_header_bytes: int = 16 * 1024
    max_connections: int = 0  # 0: no cap
    send_timeout_s: float = 30.0
    max_unsent_bytes: int = 0  # answers held for clients not reading, together; 0: no bound


class HeadersTooLarge(Exception):
    """Raised from a parser callback; httptools turns it into HttpParserCallbackError."""


class PipelineTooDeep(Exception):
    """Raised from a parser callback when a connection queues past MAX_PIPELINED."""


class UnknownTransferCoding(Exception):
    """Raised from a parser callback for a transfer coding other than chunked."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    limits = HttpLimits()
    paused_writers: dict = {}  # connection -> when its writes paused; one dict a worker (protocol_class)
    drain: Drain = Drain()  # the worker's own, set by protocol_class
    keepers: Keepers = Keepers()  # the listen queue's keepers count what the loop accepts (serving/listen_queue.py)
    refusals_lingering = [0]  # the worker's refused connections lingering, every kind (one list per protocol_class)
    _stopping = False  # set by shutdown(): a class default, so that a connection costs no attribute for it
    _upgraded = False  # an upgrade request was read: nothing after it is parsed (_after_upgrade)
    _unknown_coding: str | None = None  # a transfer coding the worker cannot undo, refused with 501
    _skipped_body_left = 0  # of its body, which httptools skipped: bytes still to come
    _send_timer: asyncio.TimerHandle | None = None  # armed while the transport is over its high-water mark
    _unsent_bytes = 0  # what was unsent then: less at the deadline, and the client is reading, only slowly
    _refusal_owed: tuple[int, str] | None = None  # given once the requests read before it are answered
    _counting_framing = False  # this read continues a body: what is not data in it is framing
    _framing = 0  # framing bytes of the request being read, over the reads that continue its body
    _body_bytes = 0  # its data so far

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.keepers.accepted(self.server)  # uvicorn's local address: which listener took it
        self._timer: asyncio.TimerHandle | None = None
        self._awaiting_headers = True
        self._raw_header_bytes = 0  # bytes received while headers were incomplete
        self._parsed_header_bytes = 0  # request line and headers parsed so far
        self._headers_too_large = False
        self._pipeline_too_deep = False
        self._answering = None  # the cycle whose ASGI task runs (self.cycle is the newest parsed)
        # Keep-alive as this protocol decides it, beside the client's wish (see _settle).
        self._changed = None  # the one cycle whose keep_alive we changed...
        self._changed_from = True  # ...and its keep_alive as parsed
        self._last = None  # while draining: the newest request, the one answered with Connection: close
        self._unread = None  # the request whose body was still arriving at the end of a read
        self._body_checked = None  # the last request whose unread body was looked at (once each)
        self._lingering = False
        self._linger_ends = self._linger_quiet_ends = 0.0
        self._refusal_lingers = False
        if self.limits.max_connections and len(self.connections) - self.refusals_lingering[0] > self.limits.max_connections:
            self._refuse_past_cap()
            return
        self._arm(self.limits.header_timeout_s, self._on_header_deadline)

    def eof_received(self) -> bool | None:
        """A client that half-closes after its requests (``shutdown(SHUT_WR)``, ``nc -N``)
        still reads their answers: the transport stays open for writing while a request
        read whole is unanswered, and closes after the last answer. uvicorn's let the
        transport close at once, and the answer was lost. An end of file inside a request
        (its body cut short) or with nothing to answer closes as before."""
        cycle = self.cycle
        if self._lingering or cycle is None or cycle.more_body or (cycle.response_complete and not self.pipeline):
            # The transport closes on return: an answer complete but still held to be
            # coalesced would be dropped by that close (a body over 1 MiB, decoded in a
            # thread, was answered just before the end of file was read).
            flush = getattr(self.transport, "flush", None)
            if flush is not None:
                flush()
            return None
        cycle.keep_alive = False  # the newest request read: the last answer, then the close
        return True

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's, unless the client's next request is already waiting in the socket. A
        loop held past the keep-alive timeout (a frozen or starved process) runs its timers
        before it reads: the close came first, with the request unread, and the reset lost
        it (3 of 7 freezes of 7-12 s). The read that follows at once cancels the new timer."""
        if self.transport.is_closing():
            return
        if _bytes_waiting(self.transport):
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
            return
        self.transport.close()

    def pause_writing(self) -> None:
        """The transport holds more of the answers than its high-water mark: the client
        reads them slower than they are written, or not at all. It has SERVING_SEND_TIMEOUT_S
        to take some before the connection is cut."""
        super().pause_writing()
        if self._send_timer is None:
            self._arm_send_deadline()
        self.paused_writers.setdefault(self, time.monotonic())
        self._keep_unsent_within_budget()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel_send_deadline()
        self.paused_writers.pop(self, None)

    def _keep_unsent_within_budget(self) -> None:
        """The send deadline runs between reads: clients reading a little every few seconds
        kept their answers in the worker's memory for good (64 such grew it to 1 GB). Past
        SERVING_MAX_UNSENT_BYTES held for paused connections together, the longest paused
        are cut, as at their send deadline."""
        budget = self.limits.max_unsent_bytes
        if not budget:
            return
        held = sum(writer.transport.get_write_buffer_size() for writer in self.paused_writers)
        while held > budget and self.paused_writers:
            oldest = min(self.paused_writers, key=self.paused_writers.__getitem__)
            held -= oldest.transport.get_write_buffer_size()
            oldest._cut_not_reading("unsent_over_budget", max_unsent_bytes=budget)

    def _should_upgrade(self) -> bool:
        return False  # HTTP only, whatever uvicorn's ws setting: see the HttpParserUpgrade branch of data_received

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refusal_lingers:
            self.refusals_lingering[0] -= 1  # its keepers were told it closed when it began to linger
        else:
            self.keepers.closed()
        self._cancel()
        self._cancel_send_deadline()
        self.paused_writers.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn's, with our refusals in place of its text/plain 400.
        if self._lingering:  # answered and half-closed: what still comes is dropped unread
            self._linger_quiet_ends = self.loop.time() + LINGER_QUIET_S
            return
        if self._upgraded:  # its skipped body, then nothing: what follows is dropped unparsed
            if self._skipped_body_left:
                self._take_skipped_body(data)
            return
        self._unset_keepalive_if_required()
        if self._awaiting_headers:
            self._raw_header_bytes += len(data)
        elif self.cycle is not None and self.cycle.more_body:
            self._counting_framing = True
            self._framing += len(data)  # on_body takes the data back out
        elif self.cycle is None or (self.cycle.response_complete and not self.pipeline):
            # An idle connection's next request, under the header deadline from its first
            # bytes: CRLFs, which llhttp skips before a request line, begin no message, and
            # one after an answer left the connection with no timer at all (uvicorn's read
            # cancels the keep-alive's), open for good. (While an answer is on its way, the
            # keep-alive timer is armed after it, as before.)
            self._awaiting_headers = True
            if data[0] not in b"\r\n" or data.strip(b"\r\n"):  # CRLFs alone are idle: a drain closes them, the deadline silently
                self._raw_header_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._pipeline_too_deep:
                logger.debug("connection closed: more than %d pipelined requests unanswered", MAX_PIPELINED)
                self._abandon_pipeline()
            elif self._headers_too_large:
                self._refuse_lingering(431, f"request headers exceed {self.limits.max_header_bytes} bytes")
            elif self._unknown_coding is not None:
                self._refuse_lingering_after_answers(501, f"Transfer-Encoding '{clip(self._unknown_coding)}' is not supported: "
                                                          "send the body chunked alone, or compressed with Content-Encoding")
            else:
                self.logger.warning("Invalid HTTP request received.")
                self._refuse_lingering_after_answers(400, "invalid HTTP request")
            return
        except httptools.HttpParserUpgrade as upgrade:
            # Handed to uvicorn's WebSocket protocol, a connection never reached this one's
            # connection_lost: each upgrade leaked a keepers' slot, and after 4,096 of them
            # the keeper refused nearly every new connection, health probes too, for good.
            self._after_upgrade(data[upgrade.args[0]:])
            return
        finally:
            self._counting_framing = False
        if self._awaiting_headers and self._raw_header_bytes > self.limits.max_header_bytes:
            self._refuse_lingering(431, f"request headers exceed {self.limits.max_header_bytes} bytes")
            return
        if self._framing - self._body_bytes > self.limits.max_header_bytes:
            self._refuse_framing()
            return
        cycle = self.cycle
        if cycle is not None and cycle.more_body and cycle.response_complete and self._body_bytes > UNREAD_BODY_READ_UP_TO:
            # A chunked body answered before it arrived is read on only to be dropped: past
            # this, the connection ends (a lingering close) rather than read 34 GB in 20 s.
            self._linger()
            return
        self._arm_deadline()

    # ---- parser callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._awaiting_headers = True
        self._parsed_header_bytes = 0
        # The rest of this read is the new request's headers (counted there) and perhaps its
        # data: its framing is counted from the next read that continues its body.
        self._counting_framing, self._framing, self._body_bytes = False, 0, 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        if not self._awaiting_headers:
            # A chunked body's trailer field: uvicorn appends it to the header list the
            # app reads, which it reads after the trailer when the request came in one
            # read. RFC 9110 §6.5.1: never merged into the headers; no app reads trailers.
            return
        super().on_header(name, value)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._counting_framing:
            self._framing -= len(body)
        super().on_body(body)

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._raw_header_bytes = self._parsed_header_bytes = 0
        self._cancel()
        self._unknown_coding = _unknown_transfer_coding(self.headers)
        if self._unknown_coding is not None:  # before a cycle exists: nothing of this request reaches the app
            raise UnknownTransferCoding
        super().on_headers_complete()
        if self.drain.is_draining and self.cycle is not None:  # the client reconnects, to where the balancer now points
            self._close_after(self.cycle)
        if len(self.pipeline) > MAX_PIPELINED:
            self._pipeline_too_deep = True
            raise PipelineTooDeep

    def on_response_complete(self) -> None:
        super().on_response_complete()  # reads on, and starts the next queued request
        if self._refusal_owed is not None and not self.transport.is_closing():
            answering = self._answering
            if self.pipeline or (answering is not None and not answering.response_complete):
                self.flow.pause_reading()  # nothing after what the parser rejected is read
            else:
                owed, self._refusal_owed = self._refusal_owed, None
                self._unset_keepalive_if_required()  # armed by uvicorn's, it would cut the linger short
                self._refuse_lingering(*owed)
            return
        if self._lingering:
            self._unset_keepalive_if_required()  # the linger's own timer closes
        elif self.pipeline and not self.transport.is_closing():
            self.flow.pause_reading()  # the queue first: reading on after every answer let it grow without bound

    def _start_asgi_task(self, cycle, app) -> None:
        self._answering = cycle
        super()._start_asgi_task(cycle, app)

    def on_message_complete(self) -> None:
        self._cancel()
        if self._unread is not None:  # its body is whole after all: keep-alive as before, unless answered already
            cycle, self._unread = self._unread, None
            self._settle(cycle)
        super().on_message_complete()
        if self.cycle is not None:
            # uvicorn's leaves more_body set on a request answered before its body ended:
            # read as a body still arriving, the idle connection got the body deadline for
            # its keep-alive, and a body ending in the read past UNREAD_BODY_READ_UP_TO ended
            # a connection whose answer had said keep-alive.
            self.cycle.more_body = False

    # ---- graceful stop (serving.drain) -------------------------------------------------

    def shutdown(self) -> None:
        """uvicorn's, called once the listener is closed (a response in progress ends with
        ``Connection: close``, an idle keep-alive connection is closed), except that a
        request still arriving is let in: its connection was accepted, its client wrote."""
        self._stopping = True  # a refusal from now on (the header deadline of one let in) closes at once
        if self._refusal_lingers:  # refused: nothing of it is served, so nothing to wait for
            self.transport.close()
            return
        if self._lingering:
            return  # answered; closes when its client does, or at the linger's bound
        if self.cycle is None or self.cycle.response_complete:
            if self._raw_header_bytes or self._parsed_header_bytes:
                return  # on_headers_complete turns keep-alive off; the header deadline still holds
            if self.cycle is None and not self.transport.is_closing():  # accepted, its first bytes not read yet
                self._arm(min(self.limits.header_timeout_s, FIRST_REQUEST_GRACE_S), self._on_header_deadline)
                return
            super().shutdown()
        elif self.cycle.response_started:
            self.cycle.keep_alive = False  # uvicorn's: closes once this answer is out
        else:  # as the newest request, so that one pipelined behind it may still come and be answered
            self._close_after(self.cycle)

    def cut(self, message: str) -> int:
        """Past the drain's bound: a 503 for the request not answered yet (1), or a close (0)."""
        if self.transport.is_closing() or self._lingering:  # lingering: answered, and nothing more can be written
            return 0
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()
            return 0
        if self.cycle.response_started:
            self._drop_cycle()
            self.transport.close()
        else:
            self._refuse(503, message, b"retry-after: 1\r\n")
        return 1

    # ---- deadlines and refusals -------------------------------------------------------

    def _count_header_bytes(self, size: int) -> None:
        # Exact for what completed within one chunk; data_received's raw count catches a
        # header still arriving (httptools buffers it) at the end of each chunk.
        self._parsed_header_bytes += size
        if self._parsed_header_bytes > self.limits.max_header_bytes:
            self._headers_too_large = True
            raise HeadersTooLarge

    def _arm_deadline(self) -> None:
        if self.transport.is_closing():
            return
        if self._awaiting_headers:
            if self._timer is None:
                self._arm(self.limits.header_timeout_s, self._on_header_deadline)
        elif self.cycle is not None and self.cycle.more_body:
            if self._body_checked is not self.cycle:
                self._body_checked = self.cycle
                if not self.cycle.response_started and _may_stay_unsent(self.cycle):
                    self._mark_unread(self.cycle)
            if self._timer is None:
                self._arm(self.limits.body_timeout_s, self._on_body_deadline)

    # ---- keep-alive: while a body is unread, and while draining -----------------------

    def _mark_unread(self, cycle) -> None:
        """Its body is still arriving (this runs after a read, before its app can answer),
        and its client may not send the rest, or the rest is too large to read only to drop
        it (``_may_stay_unsent``): should it be answered first, the answer says Connection:
        close and the connection ends with a lingering close instead of reading the rest
        as the next request."""
        self._unread = cycle
        self._change(cycle)

    def _close_after(self, cycle) -> None:
        """While draining: ``cycle``, the newest request, is answered with Connection: close;
        the one it follows, no longer the last, gets its keep-alive back, so the requests
        read before the close are answered."""
        previous = self._last
        if previous is cycle:
            return
        self._last = cycle
        if previous is not None:
            self._settle(previous)
        self._change(cycle)

    def _after_upgrade(self, rest: bytes) -> None:
        """A request asking to upgrade (WebSocket, h2c) is answered as the plain request it
        also is (RFC 9110 §7.8: a server may ignore Upgrade), and its connection ends with
        it: httptools parses nothing after it. httptools also skipped its body (``curl
        --http2 -d …`` was a 400 "empty document"): a declared length's is taken here from
        what follows; a chunked one, which only the parser could read, is refused."""
        self._upgraded = True  # httptools would parse a later read as a new request: out of step, a 400
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self.transport.close()
            return
        self._close_after(cycle)  # the last request this connection carries
        length, chunked = _declared_body(cycle)
        if chunked:
            self._refuse_lingering(400, "a chunked request body cannot come with an Upgrade header here: "
                                        "send it without Upgrade (curl: --http1.1)")
        elif length:
            cycle.more_body = True  # the parser called it complete, having skipped it
            self._skipped_body_left = length
            self._take_skipped_body(rest)

    def _take_skipped_body(self, data: bytes) -> None:
        part = data[:self._skipped_body_left]
        self._skipped_body_left -= len(part)
        if part:
            self.on_body(part)
        if self._skipped_body_left:
            self._arm_deadline()
        else:  # whole; whatever follows it is not read (the connection ends with the answer)
            self._cancel()
            self.cycle.more_body = False
            self.cycle.message_event.set()

    def _change(self, cycle) -> None:
        if self._changed is not cycle:
            self._changed, self._changed_from = cycle, cycle.keep_alive
        self._settle(cycle)

    def _settle(self, cycle) -> None:
        """keep_alive as the client asked, unless this request is the last before a drain's
        close or its body is unread; fixed once its answer has started. Without it, the
        connection ends with a lingering close."""
        if cycle is self._changed and not cycle.response_started:
            keep_alive = self._changed_from and cycle is not self._last and cycle is not self._unread
            cycle.keep_alive = keep_alive
            # uvicorn closes after an answer without keep-alive: lingering where bytes may
            # follow (a body unread, requests pipelined behind the last); a client that asked
            # to close and whose body was read whole gets a plain close
            cycle.transport = LingerOnClose(self) if cycle is self._last or cycle is self._unread else self.transport

    def _linger(self) -> None:
        """Close after the answer, reading and dropping what the client still sends: a close
        with unread bytes would be a reset, which can lose the answer before its client reads it."""
        if self._lingering or self.transport.is_closing():
            return
        self._cancel()
        self._drop_cycle()  # a request read after the one answered with the close (the client was told)
        self.pipeline.clear()
        try:
            self.transport.write_eof()  # once what is written has left
        except (NotImplementedError, AttributeError, OSError, RuntimeError):  # TLS, or gone
            self.transport.close()
            return
        self._lingering = True
        self.flow.resume_reading()
        now = self.loop.time()
        self._linger_ends, self._linger_quiet_ends = now + LINGER_MAX_S, now + LINGER_QUIET_S
        self._arm(LINGER_QUIET_S, self._on_linger_tick)

    def _on_linger_tick(self) -> None:
        self._timer = None
        now = self.loop.time()
        ends = min(self._linger_ends, self._linger_quiet_ends)
        if now >= ends:
            self.transport.close()
        else:
            self._arm(ends - now, self._on_linger_tick)

    def _arm(self, delay_s: float, callback) -> None:
        self._cancel()
        self._timer = self.loop.call_later(delay_s, callback)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_header_deadline(self) -> None:
        self._timer = None
        if not (self._raw_header_bytes or self._parsed_header_bytes) or self._response_in_progress():
            self.transport.close()  # nothing to answer, or an answer we must not interleave with
        else:
            self._refuse_lingering(408, f"request headers did not arrive within {self.limits.header_timeout_s:g} s")

    def _arm_send_deadline(self) -> None:
        self._unsent_bytes = _bytes_unsent(self.transport)
        self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._on_send_deadline)

    def _cancel_send_deadline(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _on_send_deadline(self) -> None:
        """Cut a connection whose client took nothing of its answers for SERVING_SEND_TIMEOUT_S.
        Waiting for it (uvicorn's send awaits the transport for good, and neither a deadline
        nor the keep-alive timer runs meanwhile) let clients that pipeline and never read
        hold every slot of the connection cap, and a graceful stop its full bound. An abort,
        not a close: a close waits for the unread answers to leave first."""
        self._send_timer = None
        unsent_bytes = _bytes_unsent(self.transport)
        if unsent_bytes < self._unsent_bytes:  # it took some (a large answer to a slow reader): a new deadline,
            self._arm_send_deadline()  # as nginx's send_timeout runs between two writes, not over the whole answer
            return
        self._cut_not_reading("send_timeout", timeout_s=self.limits.send_timeout_s, unsent_bytes=unsent_bytes)

    def _cut_not_reading(self, reason: str, **facts) -> None:
        logger.warning(event(reason, **facts, client=_address(self.client)))
        self.paused_writers.pop(self, None)
        self._cancel_send_deadline()
        self._disconnect_all()  # the answer being written, and the requests queued behind it, go nowhere
        _reset_on_close(self.transport)
        self.transport.abort()

    def _on_body_deadline(self) -> None:
        self._timer = None
        self._refuse_body(408, f"request body did not arrive within {self.limits.body_timeout_s:g} s")

    def _refuse_body(self, status: int, message: str) -> None:
        """A refusal of the body being read, with a lingering close; a close alone when the
        request was answered already (a 413 from its headers, an overload 503) or others
        are queued behind it: no second answer, none out of order."""
        if self.cycle is not None and not self.cycle.response_started and not self.pipeline:
            self._refuse_lingering(status, message)
        else:
            self._drop_cycle()
            self.transport.close()

    def _refuse_framing(self) -> None:
        """A chunked body's framing (chunk size lines, their extensions, CRLFs) outgrew its
        data by the header cap: llhttp reads extensions of any length and reports none of
        them, so a client streamed 42 GB of them in 35 s under no limit but the body deadline.
        Chunks of about 6 bytes of data and up never come near it."""
        self._refuse_body(413, f"the chunked body's framing (chunk size lines and extensions) exceeds its data by more than "
                               f"{self.limits.max_header_bytes} bytes")

    def _response_in_progress(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _refuse(self, status: int, message: str, extra_headers: bytes = b"") -> None:
        """Answer from the protocol (no ASGI app involved) and close the connection at once:
        only the drain's cut, past its bound, where a linger would hold the stop."""
        self._write_refusal(status, message, extra_headers)
        self._drop_cycle()
        self.transport.close()

    def _refuse_lingering(self, status: int, message: str) -> None:
        """A 400, 408 or 431: its client may still be sending (what follows a request the
        parser rejected, a slow upload, a header streamed past the cap), and a close with
        bytes unread is a reset that can fail its send before it reads the answer."""
        self._write_refusal(status, message, b"")
        self._disconnect_all()  # an app still answering an earlier request would write after the end of file
        self._linger_as_refusal()

    def _refuse_lingering_after_answers(self, status: int, message: str) -> None:
        """A refusal of what followed requests read whole, given once they are answered: a
        client that pipelined a valid request ahead of garbage lost its answer to the 400.
        Reading stops (the parser has failed); a request still arriving is refused at once."""
        newest, answering = self.cycle, self._answering
        owed = newest is not None and not newest.more_body and (
            bool(self.pipeline) or (answering is not None and not answering.response_complete))
        if not owed:
            self._refuse_lingering(status, message)
            return
        self._refusal_owed = (status, message)
        self._cancel()  # its header deadline would close the connection under the answers
        self.flow.pause_reading()

    def _refuse_past_cap(self) -> None:
        """503 before anything is read, then a lingering close: the client may be sending a
        body already. Counted once here; what it sends while lingering is never parsed."""
        metrics.count_connection_refused_at_cap()
        self._write_refusal(503, "too many open connections; retry later", b"retry-after: 1\r\n")
        self._linger_as_refusal()

    def _linger_as_refusal(self) -> None:
        """A lingering close that holds no slot of the cap (nor of the keepers' count of open
        connections): clients refused while the worker was full must not keep it full, nor
        clients refused for what they sent take the slots of those it serves. Past
        MAX_LINGERING_REFUSALS, or once a graceful stop began (it would wait for it), a close at once."""
        if self._stopping or self.refusals_lingering[0] >= MAX_LINGERING_REFUSALS:
            self.transport.close()
            return
        self._linger()
        if self._lingering:
            self._refusal_lingers = True
            self.refusals_lingering[0] += 1
            self.keepers.closed()

    def _write_refusal(self, status: int, message: str, extra_headers: bytes) -> None:
        body = orjson.dumps({"error": message})
        head = b"%scontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n%s\r\n" % (
            STATUS_LINE[status], len(body), extra_headers)
        if not self.transport.is_closing() and not self._lingering:
            self.transport.write(head + body)

    def _abandon_pipeline(self) -> None:
        """Close, every request of the connection dropped (a pipeline past MAX_PIPELINED)."""
        self._disconnect_all()
        self.transport.close()

    def _disconnect_all(self) -> None:
        """The request being answered and every queued one dropped as on a disconnect
        (their app calls see http.disconnect, their answers go nowhere)."""
        for cycle in [self._answering, self.cycle, *(queued for queued, _ in self.pipeline)]:
            if cycle is not None and not cycle.response_complete:
                _disconnect(cycle)
        self.pipeline.clear()

    def _drop_cycle(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            _disconnect(cycle)


def _disconnect(cycle) -> None:
    # The app's receive() now returns http.disconnect and its send() does nothing. Its
    # receive() would still write a 100 Continue owed: after a lingering close's end of
    # file, a write raises (before it, the transport was closing, and nothing was written).
    cycle.disconnected = True
    cycle.waiting_for_100_continue = False
    cycle.message_event.set()


def _address(client: tuple[str, int] | None) -> str | None:
    return None if client is None else f"{client[0]}:{client[1]}"


def _bytes_unsent(transport: asyncio.Transport) -> int:
    """What the client has not taken yet: the transport's buffer and the kernel's send
    queue (SIOCOUTQ). The kernel's holds megabytes: a client reading slowly drains it long
    before the transport's buffer moves."""
    unsent = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is None:
        return unsent
    try:
        return unsent + struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return unsent


def _reset_on_close(transport: asyncio.Transport) -> None:
    """Make the close a reset (SO_LINGER 0), dropping what the kernel still holds for the
    client: closed plainly, a client whose requests were all read got its FIN queued behind
    megabytes of answers it does not read (1.6 MB seen), kept by the kernel in FIN-WAIT-1
    outside SERVING_MAX_UNSENT_BYTES, and it never learned it was cut."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


def _bytes_waiting(transport: asyncio.Transport) -> bool:
    """Whether the kernel holds bytes of the connection not read yet (FIONREAD)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0] > 0
    except OSError:
        return False


def _unknown_transfer_coding(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The first transfer coding other than chunked that the request names, or None.
    httptools frames ``gzip, chunked`` as plain chunked and hands on the body still
    gzipped; RFC 9112 §6.1 answers a coding the server does not understand with 501."""
    for name, value in headers:
        if name == b"transfer-encoding":
            for coding in value.split(b","):
                coding = coding.split(b";", 1)[0].strip(b" \t").lower()
                if coding and coding != b"chunked":  # an empty list element is allowed, and names nothing
                    return coding.decode("latin-1")
    return None


def _declared_body(cycle) -> tuple[int, bool]:
    """(Content-Length, chunked) of a request, as its headers say (the parser checked them)."""
    length, chunked = 0, False
    for name, value in cycle.scope["headers"]:
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
    return length, chunked


def _may_stay_unsent(cycle) -> bool:
    """Whether an answer given before this request's body arrived must end its connection.
    A client waiting for 100 Continue may skip the body it announced (RFC 9110) and send its
    next request; a body past UNREAD_BODY_READ_UP_TO would be read only to be dropped. Any
    other body is read on by the parser and dropped, and the connection kept: under
    overload a client whose body follows its headers in another segment (httpx writes them
    apart) would otherwise reconnect after every refusal."""
    if cycle.waiting_for_100_continue or not cycle.keep_alive:
        # Or its client asked to close: uvicorn closes after the answer, and a close with the
        # rest of a chunked body unread was a reset that lost the answer.
        return True
    for name, value in cycle.scope["headers"]:
        if name == b"content-length":
            try:
                return int(value) > UNREAD_BODY_READ_UP_TO
            except ValueError:
                return True
    return False  # chunked: read on, under the body deadline


class LingerOnClose:
    """The transport a request whose body is unread answers through: its close (uvicorn's,
    after an answer without keep-alive) is the protocol's lingering close."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: GuardedHttpToolsProtocol):
        self._protocol = protocol

    def write(self, data: bytes) -> None:
        self._protocol.transport.write(data)

    def is_closing(self) -> bool:
        return self._protocol.transport.is_closing()

    def close(self) -> None:
        self._protocol._linger()

    def __getattr__(self, name: str):
        return getattr(self._protocol.transport, name)


class CoalescingTransport:
    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if self._pending:
            data, self._pending = b"".join(self._pending), []
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(GuardedHttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))


def protocol_class(limits: HttpLimits, coalesce_writes: bool, drain: Drain | None = None,
                   keepers: Keepers | None = None) -> type[GuardedHttpToolsProtocol]:
    """The protocol uvicorn is given: our guards with these limits, coalescing or not,
    following this worker's graceful stop and counting accepts for its listen-queue keepers."""
    base = CoalescingHttpToolsProtocol if coalesce_writes else GuardedHttpToolsProtocol
    limits = replace(limits, max_connections=fit_open_file_limit(limits.max_connections))
    return type(base.__name__, (base,), {"limits": limits, "drain": drain or Drain(), "keepers": keepers or Keepers(),
                                         "refusals_lingering": [0], "paused_writers": {}})


FILES_BESIDES_CONNECTIONS = 256  # models, cache, logs, the console and Redis clients
UVICORN_BACKLOG = 2048
UNCAPPED_BACKLOG = 65535  # the kernel lowers it to net.core.somaxconn


def listen_backlog(max_connections: int) -> int:
    """The listen queue, as long as the connection cap. uvicorn's 2,048 was shorter than the
    4,096 connections a worker holds by default: under a burst of new clients the kernel
    dropped SYNs the worker would have answered (a 503 at worst), and each such client
    waited out a 1 s SYN retransmission (963 drops in one 6 s open-loop overload run)."""
    return max(max_connections, UVICORN_BACKLOG) if max_connections else UNCAPPED_BACKLOG


def fit_open_file_limit(max_connections: int) -> int:
    """Raise this process's open-file limit to fit the connection cap, up to the hard
    limit; past it, lower the cap. Otherwise accept() fails with EMFILE under load and
    clients see resets instead of the cap's 503."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = (max_connections or 65536) + FILES_BESIDES_CONNECTIONS
        if soft != resource.RLIM_INFINITY and soft < wanted:
            soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or not permitted: keep the limits as they are
        return max_connections
    if soft == resource.RLIM_INFINITY:
        return max_connections
    room = max(soft - FILES_BESIDES_CONNECTIONS, 1)
    if not max_connections:
        return room
    if max_connections > room:
        logger.warning("SERVING_MAX_CONNECTIONS lowered to %d to fit the open-file limit (%d)", room, soft)
        return room
    return max_connections
