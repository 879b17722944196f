"""ASGI middleware: body size limit (413), body arrival timeout (408), in-flight and byte metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, TypeVar

from prometheus_client import Counter, Histogram
from starlette.exceptions import HTTPException

from qpart.server.api.http_errors import unexpected_response
from qpart.server.api.paths import route_label
from qpart.server.errors import UnsupportedMediaTypeError
from qpart.server.metrics import UNKNOWN_MODEL, Metrics
from qpart.server.tails.content import identity_only

M = TypeVar("M", Counter, Histogram)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# The request-state key under which a route names the model a request was for, when the path
# does not (Starlette's request.state is scope["state"], a per-request copy in uvicorn).
MODEL_STATE_KEY = "qpart_model"

# The rest of a refused body is still on its way: without "Connection: close" uvicorn keeps the
# connection and reads (and drops) whatever the client goes on trickling, so one slow client
# held a connection for as long as it liked after its 408 (RFC 9110 15.5.9: a 408 SHOULD close).
_CLOSE = {"Connection": "close"}


class _BodyGuard:
    """Wraps ``receive``: counts body bytes (413 past the limit) and bounds the body's arrival time
    (408). After the last body chunk, ``receive`` only waits for a disconnect, which a streaming
    response watches for: no deadline there, or long downloads would be cut off."""

    def __init__(self, receive: Receive, max_body: int, timeout_s: float, setting: str) -> None:
        self._receive = receive
        self._max_body = max_body
        self._setting = setting
        self._timeout = timeout_s
        self._deadline = time.monotonic() + timeout_s
        self.received = 0
        self._body_done = False

    async def __call__(self) -> Message:
        if self._body_done:
            return await self._receive()
        try:
            # asyncio.timeout, not wait_for: wait_for wraps every receive in a new task (Python
            # 3.11), measurable per request at a thousand requests per second.
            async with asyncio.timeout(max(self._deadline - time.monotonic(), 0.001)):
                message = await self._receive()
        except TimeoutError:
            raise HTTPException(408, f"request body not received within {self._timeout} s",
                                headers=_CLOSE) from None
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self._body_done = not message.get("more_body", False)
            if self.received > self._max_body:
                raise HTTPException(413, f"request body exceeds the limit of {self._max_body} bytes "
                                         f"({self._setting})", headers=_CLOSE)
        return message


class LimitsMiddleware:
    """Refuses bodies over ``max_body_bytes`` (or a route's own smaller limit in
    ``route_body_bytes``: route label -> (bytes, the setting that sets it)) and bodies that arrive
    slower than ``body_timeout_s``."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, body_timeout_s: float,
                 metrics: Metrics, known_models: Callable[[], frozenset[str]],
                 route_body_bytes: Mapping[str, tuple[int, str]] | None = None) -> None:
        self.app = app
        self.max_body = max_body_bytes
        self._body_limits = {route: limit for route, limit in (route_body_bytes or {}).items()
                             if limit[0] < max_body_bytes}
        self.timeout = body_timeout_s
        self.metrics = metrics
        self.known_models = known_models
        # prometheus_client's labels() takes a lock and checks its arguments on every call (~1.7 us,
        # four times a request); a child never changes once made, so later requests look it up here.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _model_label(self, path: str, state: object) -> str:
        parts = path.split("/")
        if len(parts) > 3 and parts[2] == "models":
            name: str | None = parts[3].removesuffix("-tail")
        else:  # a route with the model in its body records it in the request state (plan)
            name = state.get(MODEL_STATE_KEY) if isinstance(state, dict) else None
        # One spelling for "no served model": a name not served and a route naming none alike.
        return name if name is not None and name in self.known_models() else UNKNOWN_MODEL

    def _body_limit(self, route: str) -> tuple[int, str]:
        return self._body_limits.get(route, (self.max_body, "QPART_MAX_BODY_BYTES"))

    async def _refuse_declared_length(self, scope: Scope, send: Send, route: str) -> bool:
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is None:
            return False
        if not (length.isascii() and length.isdigit()):
            await _send_error(send, 400, "Content-Length is not a number")
            return True
        limit, setting = self._body_limit(route)
        if int(length) > limit:
            await _send_error(send, 413, f"request body of {int(length)} bytes exceeds the limit of "
                                         f"{limit} bytes ({setting})")
            return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_label(scope.get("path", ""))
        if await self._refuse_declared_length(scope, send, route) or await _refuse_coding(route, scope, send):
            return
        limit, setting = self._body_limit(route)
        guard = _BodyGuard(receive, limit, self.timeout, setting)
        m = self.metrics
        sent, received = self._child(m.bytes_sent, (route,)), self._child(m.bytes_received, (route,))
        duration = self._child(m.request_duration, (route,))
        status = 500
        responded = False

        async def counting_send(message: Message) -> None:
            nonlocal status, responded
            if message["type"] == "http.response.start":
                status, responded = int(message["status"]), True
            elif message["type"] == "http.response.body":
                sent.inc(len(message.get("body", b"")))
            await send(message)

        self.metrics.in_flight.inc()
        started = time.perf_counter()
        try:
            await self.app(scope, guard, counting_send)
        except Exception as exc:
            if responded:  # FastAPI's error middleware answered (and re-raises)
                raise
            # From this layer or the fast path, outside FastAPI's error middleware: the same JSON
            # 500 its handler gives, not uvicorn's plain-text one (logged there, not raised again).
            await unexpected_response(exc, scope.get("method", ""), scope.get("path", ""))(
                scope, guard, counting_send)
        finally:
            self.metrics.in_flight.dec()
            received.inc(guard.received)
            duration.observe(time.perf_counter() - started)
            self._count(route, self._model_label(scope.get("path", ""), scope.get("state")), status)

    def _count(self, route: str, model: str, status: int) -> None:
        outcome = "ok" if status < 400 else ("client_error" if status < 500 else "server_error")
        if status in (429, 503):
            outcome = "shed"
            self._child(self.metrics.shed, (route,)).inc()
        self._child(self.metrics.requests, (route, model, outcome)).inc()

    def _child(self, metric: M, labels: tuple[str, ...]) -> M:
        # Bounded: routes x (known models, "unknown") x outcomes. Nothing calls remove() or
        # clear() on these metrics; a child cached here would stop being exported if anything did.
        key = (id(metric), labels)  # the metrics live as long as this middleware
        child: M | None = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


# Routes that read a Content-Encoding themselves (the tail route inflates; v2 infer answers 404
# for an unknown model first). Every other route takes bodies as is.
_CODED_ROUTES = frozenset({"tail_infer", "v2_infer"})


async def _refuse_coding(route: str, scope: Scope, send: Send) -> bool:
    """415 for a coded body on a route that takes none: a JSON parser would read the coded bytes
    as garbage (a 422 that blames the JSON), or an identity body labelled coded would pass."""
    if route in _CODED_ROUTES:
        return False
    codings = [v.decode("latin-1") for k, v in scope.get("headers") or [] if k == b"content-encoding"]
    try:
        identity_only(codings)
    except UnsupportedMediaTypeError as exc:
        await _send_error(send, 415, str(exc))
        return True
    return False


async def _send_error(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
