"""The rate-shaped link of the end-to-end benchmarks, and an HTTP client that starts every
measured request on an empty token bucket.

``tc``'s token bucket (``tbf``) is the only shaper this kernel has. Unlike a serial link it
lends credit: while the link idles, the bucket refills (up to its burst), and that many bytes
then pass at memory speed. So before every measured transfer the device empties the bucket with
filler datagrams (:meth:`ShapedLink.quiet`). Emptying it early is not enough: the bucket refills
at the link rate during the client's own work between the filler and the request's first byte
(building the request, the connection pool, h11), which at 100 Mbit/s is kilobytes of credit.
:meth:`ShapedLink.client` returns an httpx client whose socket writes the filler right before a
quieted request's first write, so the request meets a bucket emptied microseconds earlier.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

FRAME_BYTES = 1514  # one full frame on lo at MTU 1500: 1472 B of UDP payload + UDP, IP, link headers
UDP_OVERHEAD = 42  # UDP 8 + IPv4 20 + Ethernet 14 bytes around a datagram's payload
MIN_FRAME_BYTES = UDP_OVERHEAD + 18  # the smallest filler frame sent (lo has no minimum; 60 B as Ethernet)


class Filler:
    """Filler datagrams that spend the shaper's bucket, sent to a socket of our own that is never
    read: datagrams to a closed port would each draw a 590 B ICMP "port unreachable" through the
    same shaper, queued ahead of the measured transfer (4.7 ms at 1 Mbit/s). Once the sink's
    buffer is full the kernel drops what arrives, silently."""

    def __init__(self) -> None:
        self._sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sink.bind(("127.0.0.1", 0))
        self.address: tuple[str, int] = self._sink.getsockname()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # also sends bench.harness.link's orders

    def spend(self, wire_bytes: int) -> None:
        """Send datagrams that take ``wire_bytes`` on the wire, in frames of at most
        :data:`FRAME_BYTES` (a remainder under the smallest frame is not sent)."""
        while wire_bytes >= MIN_FRAME_BYTES:
            frame = min(wire_bytes, FRAME_BYTES)
            self.sock.sendto(bytes(frame - UDP_OVERHEAD), self.address)
            wire_bytes -= frame

    def close(self) -> None:
        self.sock.close()
        self._sink.close()


def burst_bytes(rate_mbps: float) -> int:
    """The shaper's bucket: one packet up to 20 Mbit/s, two frames above.

    The bucket caps the credit a transfer can meet, so it is as small as still delivers the rate.
    With one packet, the shaper's timer wakes late after each one, and 100 Mbit/s delivered
    86 Mbit/s of TCP payload; two frames delivered 93.6, eight 95.9 (of 1514 B per frame 1448 are
    payload, 95.6%; eight frames' 12 KB initial burst adds the rest). Measured in a private
    namespace, 400 kB transfers from an idle link.
    """
    return 1600 if rate_mbps <= 20 else 2 * FRAME_BYTES


def idle_gap_s(rate_mbps: float) -> float:
    """How long the link idles before every measured transfer: the bucket's refill time + 1 ms."""
    return burst_bytes(rate_mbps) * 8 / (rate_mbps * 1e6) + 0.001


def shape(rate_mbps: float | None) -> None:
    """Token bucket on loopback at ``rate`` (None: remove the shaper)."""
    if rate_mbps is None:
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], check=False, capture_output=True)
        return
    subprocess.run(["tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", f"{rate_mbps}mbit",
                    "burst", str(burst_bytes(rate_mbps)), "latency", "1s"], check=True)


class ShapedLink:
    """The device's side of the shaped link at one rate (``None``: unshaped, nothing to do)."""

    def __init__(self, rate_mbps: float | None = None, server_control_port: int | None = None) -> None:
        self.rate_mbps = rate_mbps
        self._armed = False
        self._server_control = server_control_port  # bench.harness.shaped_server's orders port, if any
        self._filler = Filler()

    def set_rate(self, rate_mbps: float | None) -> None:
        """Shape loopback at ``rate_mbps`` (None: unshaped) from now on, and tell the server's
        filler layer (:mod:`bench.harness.shaped_server`) the rate and the bucket."""
        shape(rate_mbps)
        self.rate_mbps = rate_mbps
        self._armed = False
        if self._server_control is not None:
            order = "0 0" if rate_mbps is None else f"{rate_mbps} {burst_bytes(rate_mbps)}"
            self._filler.sock.sendto(order.encode("ascii"), ("127.0.0.1", self._server_control))
            time.sleep(0.05)  # delivered before any measured response (it crosses the shaper too)

    def quiet(self) -> None:
        """Idle until the bucket is surely full, and have the next request's first write empty it.

        The link idles as a serial link does between transfers (the device computed meanwhile);
        the next request through :meth:`client` then starts on an empty bucket and is paced at
        the rate throughout. Without a request the bucket stays full.
        """
        if self.rate_mbps is None:
            return
        time.sleep(idle_gap_s(self.rate_mbps))
        self._armed = True

    def before_write(self) -> None:
        """Spend the bucket (called by the client's socket right before it writes)."""
        armed, self._armed = self._armed, False
        if not armed or self.rate_mbps is None:
            return
        self._filler.spend(burst_bytes(self.rate_mbps))

    def client(self, timeout: float) -> httpx.Client:
        """An httpx client whose requests honour :meth:`quiet`."""
        return httpx.Client(timeout=timeout, transport=_QuietTransport(self))

    def close(self) -> None:
        self._filler.close()


class _QuietStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, link: ShapedLink) -> None:
        self._inner, self._link = inner, link

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._link.before_write()
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        raise NotImplementedError("the benchmark link is plain HTTP")

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _QuietBackend(httpcore.NetworkBackend):
    def __init__(self, link: ShapedLink) -> None:
        self._inner, self._link = httpcore.SyncBackend(), link

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _QuietStream(stream, self._link)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _QuietTransport(httpx.HTTPTransport):
    """httpx's own transport over a connection pool on :class:`_QuietBackend`. httpx takes no
    network backend argument; its transport keeps the pool in ``_pool`` (httpx 0.27-0.28), which
    is replaced by one with httpx's default limits."""

    def __init__(self, link: ShapedLink) -> None:
        super().__init__()
        self._pool = httpcore.ConnectionPool(  # httpx's default limits, as the replaced pool had
            max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0,
            network_backend=_QuietBackend(link))
