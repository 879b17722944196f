"""One overall deadline per transfer, down to the socket: connect, TLS, request, status line,
headers and body.

httpx's timeouts are per operation: a server that sends one byte of its headers every few seconds
keeps a read timeout from ever firing, and holds a device for days. Here every socket operation of
a transfer takes the smaller of its own timeout and the time left to the transfer's deadline, set
for the current thread of work by :func:`transfer_deadline`; past the deadline the operation raises
:class:`TransferDeadlineError`. It is done at httpcore's public network-backend seam (a wrapper
around its ``SyncBackend``), so the HTTP parsing stays httpx's and httpcore's own.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import httpcore
import httpx

from qpart.client.errors import TransferDeadlineError

WRITE_SLICE_BYTES = 64 * 1024
"""The most one socket write sends before the time left is looked at again."""
_DEADLINE: ContextVar[float | None] = ContextVar("qpart_transfer_deadline", default=None)


@contextmanager
def transfer_deadline(deadline: float | None) -> Iterator[None]:
    """Hold every socket operation in the block to ``deadline`` (a :func:`time.monotonic` instant;
    ``None``: only the per-operation timeouts)."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _past() -> TransferDeadlineError:
    return TransferDeadlineError("the transfer outlived its deadline (QPART_DEVICE_TRANSFER_DEADLINE_S); "
                                 "the server sends too slowly")


def _clamp(timeout: float | None) -> float | None:
    """``timeout`` cut to the time left before the current deadline; raises once it has passed."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise _past()
    return left if timeout is None else min(timeout, left)


def _expired() -> bool:
    deadline = _DEADLINE.get()
    return deadline is not None and time.monotonic() >= deadline


class _DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every operation ends by the current transfer's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return self._inner.read(max_bytes, _clamp(timeout))
        except httpcore.ReadTimeout:
            if _expired():
                raise _past() from None
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """``buffer`` a slice at a time, each held to the time left (a server draining an upload
        slowly would otherwise keep one long write going past the deadline)."""
        view = memoryview(buffer)
        for start in range(0, max(len(view), 1), WRITE_SLICE_BYTES):
            try:
                self._inner.write(bytes(view[start:start + WRITE_SLICE_BYTES]), _clamp(timeout))
            except httpcore.WriteTimeout:
                if _expired():
                    raise _past() from None
                raise

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, _clamp(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's network backend with every stream held to the current transfer's deadline."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        try:
            stream = self._inner.connect_tcp(host, port, _clamp(timeout), local_address, socket_options)
        except httpcore.ConnectTimeout:
            if _expired():
                raise _past() from None
            raise
        return _DeadlineStream(stream)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_unix_socket(path, _clamp(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _hold(transport: httpx.BaseTransport) -> None:
    """Put ``transport``'s connection pool on the deadline backend. httpx builds its pool with
    httpcore's default backend and has no argument for another, so its attribute is replaced; a
    test fails if a new httpx moves it."""
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is None:
        raise RuntimeError("httpx's transport has no connection pool network backend to hold to "
                           "a deadline; this httpx is not supported")
    if not isinstance(backend, _DeadlineBackend):
        pool._network_backend = _DeadlineBackend(backend)  # type: ignore[union-attr]


def deadline_client(**kwargs: Any) -> httpx.Client:
    """An :class:`httpx.Client` (``kwargs`` as its own) whose connections honour
    :func:`transfer_deadline`, including those through a proxy taken from the environment."""
    client = httpx.Client(**kwargs)
    _hold(client._transport)
    for mounted in client._mounts.values():
        if isinstance(mounted, httpx.HTTPTransport):
            _hold(mounted)
    return client
