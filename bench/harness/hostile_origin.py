"""A loopback HTTP server that plays a device's server, or another origin a plan names, for the
hostile-server benchmark (:mod:`bench.micro.hostile_device`): each path answers as its case says
(a canned answer, an endless or dripping body), every other one is passed on to an upstream server
(a real ``qpart serve``), and every request is recorded with whether it carried credentials.

Every answer this server makes up stops by itself, after :attr:`Origin.stop_s` seconds or
:attr:`Origin.stop_bytes` bytes, whichever comes first, so that a device without bounds is stopped
by the benchmark's watch (:mod:`bench.harness.watched_process`) rather than by the disk filling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import httpx

Route = Callable[["Exchange"], None]
"""What one path answers; it writes the whole response with :class:`Exchange`'s handler."""

PIECE_BYTES = 64 << 10
"""What an endless body writes at a time."""
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host",
                "content-encoding"}
"""Headers of one hop, not passed on by the proxy (it re-frames each answer, decoded)."""


@dataclass(frozen=True)
class Seen:
    """One request the origin received."""

    method: str
    path: str
    authorization: bool
    """It carried an ``Authorization`` header (the device's bearer token)."""
    body_bytes: int
    """The bytes of its body (an upload carries the activation)."""


@dataclass
class Exchange:
    """One request being answered: its handler (to write the answer), its body, and the origin."""

    handler: BaseHTTPRequestHandler
    body: bytes
    origin: Origin

    @property
    def head_only(self) -> bool:
        return self.handler.command == "HEAD"


@dataclass
class Origin:
    """A loopback server: ``routes`` (path without query → answer), the rest passed to ``upstream``."""

    upstream: str | None = None
    stop_s: float = 120.0
    """The longest a made-up answer lasts."""
    stop_bytes: int = 2 << 30
    """The most bytes a made-up endless answer sends."""
    routes: dict[str, Route] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _client: httpx.Client | None = None

    def __enter__(self) -> Self:
        handler = type("Handler", (_Handler,), {"origin": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._client = httpx.Client(base_url=self.upstream or "http://upstream.invalid", timeout=30)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)
        if self._client is not None:
            self._client.close()

    def reset(self, routes: dict[str, Route] | None = None) -> None:
        """Forget what was seen and answer with ``routes`` from now on."""
        self.routes = dict(routes or {})
        self.seen = []

    def proxy(self, ex: Exchange) -> None:
        """Pass the request to :attr:`upstream` and its answer back (decoded, re-framed)."""
        if self._client is None or self.upstream is None:
            send(ex, 404, b'{"error": "no such route"}')
            return
        h = ex.handler
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP_HEADERS}
        answer = self._client.request(h.command, h.path, content=ex.body, headers=headers)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_HEADERS}
        if ex.head_only and "content-length" in answer.headers:
            kept["Content-Length"] = answer.headers["content-length"]  # what a GET would send
        send(ex, answer.status_code, answer.content, kept)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A device hanging up mid-answer is what these answers are for: not an error."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # a device that stops reading without closing ends the answer, not the server
    origin: Origin

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        auth = self.headers.get("authorization") is not None
        self.origin.seen.append(Seen(self.command, self.path, auth, len(body)))
        route = self.origin.routes.get(self.path.split("?")[0], self.origin.proxy)
        try:
            route(Exchange(self, body, self.origin))
        except OSError:
            self.close_connection = True  # the device hung up, or stopped reading

    do_GET = do_POST = do_HEAD = _answer

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the benchmark records what it needs in :attr:`Origin.seen`."""


def send(ex: Exchange, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    """A whole answer with its ``Content-Length`` (unless ``headers`` give one; no body for a HEAD)."""
    h = ex.handler
    h.send_response(status)
    for name, value in {"Content-Type": "application/json", "Content-Length": str(len(body)),
                        **(headers or {})}.items():
        h.send_header(name, value)
    h.end_headers()
    if not ex.head_only:
        h.wfile.write(body)


def answer(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> Route:
    """A route that answers ``body`` whole."""
    return lambda ex: send(ex, status, body, headers)


def stream(first: bytes, piece: bytes = b" " * PIECE_BYTES, every_s: float = 0.0,
           length: int | None = None, headers: dict[str, str] | None = None) -> Route:
    """A route that sends ``first``, then ``piece`` after ``piece`` (every ``every_s`` seconds; 0:
    as fast as the device reads) until the origin's stop, the device hanging up, or ``length``
    bytes in all when ``length`` is given (announced as ``Content-Length``, which may be a lie; with
    none the body ends when the connection closes). An empty ``piece``: the connection closes after
    ``first``, short of ``length`` (a lost connection)."""

    def route(ex: Exchange) -> None:
        h = ex.handler
        h.send_response(200)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            h.send_header(name, value)
        if length is not None:
            h.send_header("Content-Length", str(length))
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        if ex.head_only:
            return
        sent = len(first)
        h.wfile.write(first)
        h.wfile.flush()
        stop = time.monotonic() + ex.origin.stop_s
        most = min(ex.origin.stop_bytes, length if length is not None else ex.origin.stop_bytes)
        while piece and time.monotonic() < stop and sent < most:
            if every_s:
                time.sleep(every_s)
            chunk = piece[:most - sent]
            h.wfile.write(chunk)
            h.wfile.flush()
            sent += len(chunk)

    return route


def head_drip(every_s: float) -> Route:
    """A route that sends a status line, then one byte of a header every ``every_s`` seconds until
    the origin's stop: an answer whose head never ends, each pause shorter than a read timeout."""

    def route(ex: Exchange) -> None:
        h = ex.handler
        h.close_connection = True
        h.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
        h.wfile.flush()
        stop = time.monotonic() + ex.origin.stop_s
        while time.monotonic() < stop:
            time.sleep(every_s)
            h.wfile.write(b"a")
            h.wfile.flush()

    return route
