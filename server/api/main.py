"""Running the server under uvicorn with a graceful drain on SIGTERM/SIGINT.

On the first signal readiness turns 503 at once and every answer says ``connection: close``; the
server keeps serving for ``drain_delay_s`` (so load balancers stop sending), then uvicorn stops
accepting and waits at most ``graceful_timeout_s`` for in-flight requests and for kept-alive
connections to end (after an answer that says so, or by their keep-alive timer): no request is cut
unanswered (ADR 0022).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import resource
import socket
import threading
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from qpart.server.api.app import create_app
from qpart.server.api.connections import PROBE_RESERVE, ConnectionLimits, Drain, guarded_protocol
from qpart.server.api.listeners import empty_listeners
from qpart.server.api.log_throttle import throttle_warnings
from qpart.server.engine import Engine
from qpart.server.metrics import ConnectionCounts
from qpart.server.settings import ServerSettings

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """uvicorn server whose exit signal first flips readiness, then stops after a delay."""

    def __init__(self, config: uvicorn.Config, drain_delay_s: float, drain: Drain | None = None) -> None:
        super().__init__(config)
        self._drain_delay_s = drain_delay_s
        self._draining = False
        self._drain = drain or Drain()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        engine = _engine_of(self.config.loaded_app)
        if self._draining or engine is None:
            super().handle_exit(sig, frame)
            return
        self._draining = True
        engine.draining = True
        self._drain.started = True
        # The connections are the loop's: end them from it, not from inside a signal handler.
        with contextlib.suppress(RuntimeError):  # no loop yet: nothing is connected
            asyncio.get_running_loop().call_soon_threadsafe(self._drain.begin, self.server_state.connections)
        log.info("signal %s: readiness is now 503; stopping in %.1f s", sig, self._drain_delay_s)
        timer = threading.Timer(self._drain_delay_s, self._stop)
        timer.daemon = True
        timer.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn closes the listeners first: have them accept what is queued, and no more, before.
        await empty_listeners(self.servers)
        await super().shutdown(sockets)

    def _stop(self) -> None:
        # Not super().handle_exit: uvicorn (>= 0.29) records the signal there and raises it again
        # once shut down, so even a clean drain ended in death by SIGTERM (status 143 in a
        # container, an error to supervisors). The drain is the designed answer to SIGTERM: exit 0.
        # A second signal still goes through uvicorn's handler (and is raised again).
        self.should_exit = True


def _app_of(app: object) -> FastAPI | None:
    """The FastAPI app inside ``app``'s chain of ``.app`` wrappers (uvicorn's proxy-headers layer,
    a harness's), if any."""
    for _ in range(8):
        if isinstance(app, FastAPI):
            return app
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


def _engine_of(app: object) -> Engine | None:
    """The engine of the FastAPI app inside ``app``, once its lifespan has built one."""
    fastapi_app = _app_of(app)
    engine = getattr(fastapi_app.state, "engine", None) if fastapi_app is not None else None
    return engine if isinstance(engine, Engine) else None


_SPARE_DESCRIPTORS = 256  # model files, logs, threads' pipes, the listening socket


def _ensure_descriptors(needed: int) -> None:
    """Raise the soft file-descriptor limit towards ``needed`` (the connection cap is only a
    guard if descriptors outlast it); warn when the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        log.warning("file descriptor limit %d is below QPART_MAX_CONNECTIONS plus reserve (%d): "
                    "lower QPART_MAX_CONNECTIONS or raise the limit (ulimit -n)", target, needed)


def serve(settings: ServerSettings, wrap: Callable[[ASGIApp], ASGIApp] | None = None) -> None:
    """Run until a signal; blocks. ``wrap`` puts an outer ASGI layer around the app (test and
    benchmark harnesses; a wrapper that keeps the app as ``.app`` keeps the drain working)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app: ASGIApp = create_app(settings)
    if wrap is not None:
        app = wrap(app)
    limits = ConnectionLimits(settings.max_header_bytes, settings.header_timeout_s, settings.max_connections)
    _ensure_descriptors(settings.max_connections + PROBE_RESERVE + _SPARE_DESCRIPTORS)
    engine_app = _app_of(app)
    counts = engine_app.state.metrics.connections if engine_app is not None else ConnectionCounts()
    drain = Drain()
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                            http=guarded_protocol(limits, counts, drain),
                            timeout_keep_alive=settings.keepalive_timeout_s,
                            # uvicorn reads None as "wait forever": always pass a bound.
                            timeout_graceful_shutdown=max(1, math.ceil(settings.graceful_timeout_s)),
                            access_log=False, lifespan="on", proxy_headers=settings.proxy_headers)
    # One warning per malformed request (uvicorn) or per 5xx answer: rate-limited, so that no client
    # fills the log. After uvicorn.Config, which configures its loggers.
    for name in ("uvicorn.error", "qpart.server.api.http_errors"):
        throttle_warnings(logging.getLogger(name))
    DrainingServer(config, settings.drain_delay_s, drain).run()
