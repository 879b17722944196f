"""Closing a listening socket without resetting the connections queued on it.

Closing a listener resets every connection the kernel has completed but the server has not yet
accepted, and a request its client has already written on it is lost unanswered. In a drain every
answer says ``connection: close``, so clients reconnect all the time and some connections are always
queued. On Linux a socket filter first drops new handshakes (a client's SYN: it retries, finds the
port closed, and its connect fails before it has written anything), the event loop accepts what is
queued, and only then does the listener close (ADR 0022). Elsewhere the listener closes as it is.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import select
import socket
import struct
import sys
from collections.abc import Iterable

log = logging.getLogger(__name__)

SO_ATTACH_FILTER = 26  # Linux <asm-generic/socket.h>; the socket module does not name it
SETTLE_S = 0.005  # how often the queue is looked at, and how long it must stay empty
QUIET_TIMEOUT_S = 1.0  # the most the listener's close waits for its queue to empty

# Classic BPF, run by TCP with the packet's data at its TCP header: a segment with SYN set is
# dropped (no byte kept), every other one kept, so handshakes under way still complete.
_SYN_FLAG = 0x02
_DROP_SYN = b"".join(struct.pack("HBBI", *insn) for insn in (
    (0x30, 0, 0, 13),  # ldb [13]: the TCP flags byte
    (0x45, 0, 1, _SYN_FLAG),  # jset #SYN: fall through to drop, else skip to keep
    (0x06, 0, 0, 0),  # ret #0: drop
    (0x06, 0, 0, 0xFFFFFFFF),  # ret #-1: keep the whole segment
))


def refuse_handshakes(sock: socket.socket) -> bool:
    """Drop new connections' SYNs on the listener ``sock``; False where that cannot be done."""
    if sys.platform != "linux":
        return False
    program = ctypes.create_string_buffer(_DROP_SYN, len(_DROP_SYN))
    fprog = struct.pack("HL", len(_DROP_SYN) // 8, ctypes.addressof(program))  # struct sock_fprog
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)  # the kernel copies the program
    except OSError as exc:
        log.warning("cannot stop new connections before closing the listener (%s): connections "
                    "queued at the close are reset", exc)
        return False
    return True


def _queued(sock: socket.socket) -> bool:
    """Whether connections wait on the listener ``sock`` to be accepted (it polls readable)."""
    readable, _, _ = select.select([sock.fileno()], [], [], 0)
    return bool(readable)


async def empty_listeners(servers: Iterable[asyncio.Server], timeout_s: float = QUIET_TIMEOUT_S) -> None:
    """Stop new handshakes on every listener of ``servers``, then wait (at most ``timeout_s``) until
    the event loop has accepted every connection queued on them, so that closing them resets none."""
    sockets = [sock for server in servers for sock in server.sockets]
    if not all([refuse_handshakes(sock) for sock in sockets]):
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    quiet = 0
    while quiet < 2 and loop.time() < deadline:  # empty twice in a row: no handshake was finishing
        await asyncio.sleep(SETTLE_S)
        quiet = 0 if any(_queued(sock) for sock in sockets) else quiet + 1
