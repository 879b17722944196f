"""One socket write per small response: uvicorn's httptools protocol, with the header block held back
until the body's first write.

uvicorn writes a response's status line and headers, then its body, as two transport writes. On
uvloop each is a ``send`` system call and, with ``TCP_NODELAY``, its own TCP segment: a 700-byte
tail answer cost two of each. :class:`CoalescingTransport` holds a write that ends a header
block (``\\r\\n\\r\\n``) and sends it joined to the next write, or at the end of the event loop's
current pass if no write follows (a bodyless answer, a stream whose first chunk is not ready).
Every other write goes straight through, after anything held, so bytes keep their order.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_HEADER_END = b"\r\n\r\n"


class CoalescingTransport:
    """A transport that joins a held header block to the write after it; the rest delegates."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        chunk = bytes(data)
        if self._held is not None:  # one system call for both (uvloop: writev; no copy of the body)
            held, self._held = self._held, None
            self._transport.writelines((held, chunk))
        elif chunk.endswith(_HEADER_END):
            self._held = chunk
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(chunk)

    def flush(self) -> None:
        """Send what is held, if anything."""
        if self._held is not None:
            held, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause/resume_reading...
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a :class:`CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
