"""The QPART server as the link benchmarks run it: ``qpart serve`` with one outer ASGI layer that
spends what the shaper's token bucket saved while the server computed, right before each
response goes out.

``python -m bench.harness.shaped_server --artifacts DIR`` (settings from ``QPART_*`` as ``qpart serve``;
``QPART_BENCH_FILLER_PORT``: the loopback UDP port it takes its orders on, see below)

A token bucket refills while the server computes, and the answer then leaves at memory speed (from
5 Mbit/s up, a CNN tail's time saves about a whole answer); a serial link lends nothing. The device side
(:class:`bench.harness.link.ShapedLink`) empties the full bucket before each request's first byte. Here
the bucket is not full: the request drained it, and it refilled for as long as the server worked
since. So before ``http.response.start`` this layer sends filler datagrams (to a socket that is
never read) that add up to ``min(bucket, rate x time since the request's body arrived)`` bytes on
the wire; more would queue ahead of the answer and delay it, less would lend it the rest. The
body's arrival is taken when the app read it, a little after it left the shaper: what remains
lent is the rate times that lag (tens of microseconds).

The link's rate and bucket come as a datagram ``"<Mbit/s> <bucket bytes>"`` to the orders port,
sent by the benchmark whenever it changes the shaper (``"0 0"``: unshaped, nothing sent); each
response first drains that port without waiting. The product's app runs unchanged inside
(``server.api.main.serve`` with a wrapper), behind the naive baselines' routes
(:mod:`bench.harness.baseline_routes`), which cross the same link.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bench.harness.baseline_routes import BaselineRoutes
from bench.harness.link import Filler
from qpart.server.api.main import serve
from qpart.server.settings import ServerSettings

CONTROL_PORT_ENV = "QPART_BENCH_FILLER_PORT"


class ResponseFiller:
    """ASGI layer: before each ``http.response.start``, send filler datagrams worth what the bucket
    saved since the request's body arrived (through the shaper, like every packet on loopback)."""

    def __init__(self, app: ASGIApp, control_port: int | None) -> None:
        self.app = app
        self._bytes_per_s = 0.0
        self._bucket = 0
        self._control: socket.socket | None = None
        if control_port is not None:
            self._control = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._control.bind(("127.0.0.1", control_port))
            self._control.setblocking(False)
        self._filler = Filler()

    def close(self) -> None:
        """Close the layer's sockets (the process's end does it otherwise)."""
        if self._control is not None:
            self._control.close()
        self._filler.close()

    def _read_orders(self) -> None:
        while self._control is not None:
            try:
                order = self._control.recv(64)
            except BlockingIOError:
                return
            try:
                rate, bucket = order.decode("ascii").split()
                self._bytes_per_s, self._bucket = float(rate) * 1e6 / 8, int(bucket)
            except ValueError:  # not an order of bench.harness.link's: keep the last one
                continue

    def saved_bytes(self, idle_s: float) -> int:
        """What the bucket holds after ``idle_s`` of refilling from empty (0 when unshaped)."""
        self._read_orders()
        return round(min(self._bucket, self._bytes_per_s * idle_s))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_done = time.perf_counter()

        async def timed_receive() -> Message:
            nonlocal body_done
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_done = time.perf_counter()
            return message

        async def send_after_filler(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._filler.spend(self.saved_bytes(time.perf_counter() - body_done))
            await send(message)

        await self.app(scope, timed_receive, send_after_filler)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: ``qpart serve`` with :class:`ResponseFiller` outside."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, required=True, help="calibration artifacts to serve")
    parser.add_argument("--autoencoders", type=Path, default=None,
                        help="bench.harness.autoencoder's folders, for the autoencoder baseline's routes")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    port = os.environ.get(CONTROL_PORT_ENV)
    serve(ServerSettings(artifacts=args.artifacts),
          wrap=lambda app: ResponseFiller(BaselineRoutes(app, args.autoencoders),
                                          int(port) if port else None))


if __name__ == "__main__":
    main()
