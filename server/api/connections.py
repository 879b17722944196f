"""Connection limits in the HTTP protocol itself, before any request reaches the app: the size of a
request's head (431), the time to send it (408), and how many connections may be open at once; and
how connections end in a drain (every answer says ``connection: close``, none is cut unanswered).

uvicorn's httptools protocol bounds none of these: a head is fed to the parser however large it
grows (httptools joins a split header value by concatenation, so time grows with its square), a
connection that sends nothing or trickles its head is never timed out, and connections are
accepted until file descriptors run out. :func:`guarded_protocol` returns its subclass with them.

uvicorn's shutdown closes an idle keep-alive connection at once, and so resets a request its client
has just written (issue 52, finding 11): here a connection is closed only after an answer saying so,
or by its keep-alive timer with nothing unread (ADR 0022).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import struct
import termios
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from qpart.server.metrics import ConnectionCounts

log = logging.getLogger(__name__)
_HEAD_END = b"\r\n\r\n"
PROBE_RESERVE = 64  # connections past the cap that may still ask a health route
PROBE_TIMEOUT_S = 1.0  # the head time such a connection gets
PROBE_PREFIX = b"/v2/health/"
CHUNK_FRAMING_BYTES = 32  # allowance per body chunk for its size line and CRLFs


@dataclass(frozen=True)
class ConnectionLimits:
    """What :class:`GuardedProtocol` enforces (from :class:`server.settings.ServerSettings`)."""

    max_header_bytes: int
    header_timeout_s: float
    max_connections: int


@dataclass
class Drain:
    """Whether the server is draining: set once, on the first SIGTERM/SIGINT, never cleared."""

    started: bool = False

    def begin(self, connections: Iterable[object]) -> None:
        """Start the drain (on the event loop): every answer from now on says
        ``connection: close``, those in flight included where their head is still to be sent."""
        self.started = True
        for connection in list(connections):
            if isinstance(connection, GuardedProtocol):
                connection.shutdown()


def _answer(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head bounded in bytes and time, and a connection cap.

    The head's bytes are counted before the parser sees them, so an oversize head costs one scan
    of at most ``max_header_bytes`` bytes. The head timer runs from the connection's opening, and
    again from the first byte of each later request, until the head is complete.
    """

    limits: ClassVar[ConnectionLimits]
    counts: ClassVar[ConnectionCounts]
    drain: ClassVar[Drain]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes: int | None = 0  # bytes of the head being received; None: in a body
        self._head_timer: asyncio.TimerHandle | None = None
        self._probe_only = False  # past the cap: health routes only, then closed
        self._after_head = 0  # bytes fed since the head: body, chunk framing, trailers
        self._body_bytes = 0
        self._chunks = 0
        self._head_tail = b""  # the last bytes of a head split over reads, for its blank line

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        open_now = len(self.connections)
        if open_now >= self.limits.max_connections + PROBE_RESERVE:
            # Refused before it costs anything: the established connections keep their share.
            self.counts.over_cap += 1
            if self.counts.over_cap & (self.counts.over_cap - 1) == 0:  # 1, 2, 4, ...: no log flood
                log.warning("connection refused: %d connections are open (QPART_MAX_CONNECTIONS); "
                            "%d refused so far", len(self.connections), self.counts.over_cap)
            transport.abort()
            return
        super().connection_made(transport)
        # Past the cap a few more may ask /v2/health/* (probes open a connection each time), with
        # a short head timeout, and are closed after the answer.
        self._probe_only = open_now >= self.limits.max_connections
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        if self.transport is None:  # refused in connection_made: uvicorn never knew of it
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._head_bytes is not None:
            if self._head_timer is None:
                self._arm_head_timer()
            room = self.limits.max_header_bytes - self._head_bytes
            end = data.find(_HEAD_END, 0, room + len(_HEAD_END))
            if end < 0 and self._head_tail and (self._head_tail + data[:3]).find(_HEAD_END) >= 0:
                end = 0  # the blank line straddles two reads
            if end < 0 and len(data) > room:
                self._refuse(431, "Request Header Fields Too Large",
                             f"the request head exceeds {self.limits.max_header_bytes} bytes "
                             "(QPART_MAX_HEADER_BYTES)")
                self.counts.head_too_large += 1
                return
            self._head_bytes += len(data) if end < 0 else end
            self._head_tail = data[-3:] if end < 0 else b""
            super().data_received(data)
            return
        super().data_received(data)
        self._after_head += len(data)
        # Chunk framing and trailers are neither body nor head: bound them like a head, or a
        # trailer grows without limit (and httptools joins its pieces quadratically).
        framing = self._after_head - self._body_bytes - CHUNK_FRAMING_BYTES * self._chunks
        if self._head_bytes is None and framing > self.limits.max_header_bytes:
            self.counts.head_too_large += 1
            self._refuse(431, "Request Header Fields Too Large",
                         f"chunk framing and trailers exceed {self.limits.max_header_bytes} bytes "
                         "(QPART_MAX_HEADER_BYTES)")

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._after_head = self._body_bytes = self._chunks = 0
        self._disarm_head_timer()
        if self._probe_only and not self.url.startswith(PROBE_PREFIX):
            self.counts.over_cap += 1
            self._refuse(503, "Service Unavailable",
                         f"{self.limits.max_connections} connections are open (QPART_MAX_CONNECTIONS); "
                         "retry later")
            return
        super().on_headers_complete()
        if (self.drain.started or self._probe_only) and self.cycle is not None:
            self.cycle.keep_alive = False  # the answer says connection: close, then it closes

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        self._chunks += 1
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_bytes = 0  # the next request's head; its timer starts with its first byte
        self._after_head = self._body_bytes = self._chunks = 0

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._probe_only and not self.transport.is_closing():
            self.transport.close()  # its slot is the probes' reserve, not a keep-alive

    def shutdown(self) -> None:
        """End the connection gracefully (uvicorn calls this when it closes the listener; the drain
        at its start): a request in flight whose answer has not begun is answered with
        ``connection: close``. An idle connection is left open (uvicorn closes it at once, and a
        request its client is writing meanwhile is reset unanswered): its next request is answered
        with ``connection: close`` as :attr:`drain` says, or its keep-alive timer closes it."""
        if self.cycle is not None and not self.cycle.response_started:
            self.cycle.keep_alive = False

    def timeout_keep_alive_handler(self) -> None:
        # A request that arrived after the loop last polled this socket is unread but not lost:
        # read and answer it rather than reset it with the close.
        if not self.transport.is_closing() and self._unread_bytes() == 0:
            self.transport.close()

    def _unread_bytes(self) -> int:
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return 0
        try:
            buffer = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return 0
        return int(struct.unpack("i", buffer)[0])

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        timeout = min(PROBE_TIMEOUT_S, self.limits.header_timeout_s) if self._probe_only else \
            self.limits.header_timeout_s
        self._head_timer = self.loop.call_later(timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._head_bytes is None or self.transport.is_closing():
            return
        self.counts.head_timeout += 1
        self._refuse(408, "Request Timeout",
                     f"the request head did not arrive within {self.limits.header_timeout_s:g} s "
                     "(QPART_HEADER_TIMEOUT_S)")

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self._disarm_head_timer()
        if not self.transport.is_closing():
            self.transport.write(_answer(status, reason, message))
            self.transport.close()


def guarded_protocol(limits: ConnectionLimits, counts: ConnectionCounts,
                     drain: Drain | None = None) -> type[GuardedProtocol]:
    """A :class:`GuardedProtocol` class bound to ``limits`` (uvicorn builds one per connection)
    whose connections add to ``counts`` and close as ``drain`` says."""
    return type("QpartHttpProtocol", (GuardedProtocol,),
                {"limits": limits, "counts": counts, "drain": drain or Drain()})
