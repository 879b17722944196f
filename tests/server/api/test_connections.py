"""How :class:`GuardedProtocol`'s connections end: a drain's answers say ``connection: close``, an
idle connection is not cut by the drain, and the keep-alive timer never closes a connection whose
next request is waiting to be read (ADR 0022)."""

from __future__ import annotations

import asyncio
import socket

import uvicorn
from uvicorn.server import ServerState

from qpart.server.api.connections import ConnectionLimits, Drain, GuardedProtocol, guarded_protocol
from qpart.server.metrics import ConnectionCounts

REQUEST = b"GET /x HTTP/1.1\r\nhost: test\r\n\r\n"


async def _ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _connect(drain: Drain) -> tuple[GuardedProtocol, asyncio.Transport, socket.socket, ServerState]:
    """A protocol serving one real loopback TCP connection; the client's end, non-blocking."""
    cls = guarded_protocol(ConnectionLimits(8192, 10.0, 100), ConnectionCounts(), drain)
    config = uvicorn.Config(_ok, http=cls, lifespan="off", log_level="warning")
    config.load()
    state = ServerState()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
    client.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_accepted_socket(
        lambda: cls(config=config, server_state=state, app_state={}), accepted)
    assert isinstance(protocol, GuardedProtocol)
    return protocol, transport, client, state


async def _answer(client: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while not data.endswith(b"ok"):
        chunk = await asyncio.wait_for(loop.sock_recv(client, 4096), 5)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data.lower()


def test_the_keep_alive_timer_leaves_a_connection_whose_request_waits_unread():
    async def run() -> None:
        protocol, transport, client, _ = await _connect(Drain())
        transport.pause_reading()  # the request arrives after the loop last read this socket
        client.send(REQUEST)
        await asyncio.sleep(0.05)
        protocol.timeout_keep_alive_handler()
        assert not transport.is_closing()
        transport.resume_reading()
        assert (await _answer(client)).startswith(b"http/1.1 200")
        await asyncio.sleep(0.05)
        protocol.timeout_keep_alive_handler()  # idle, nothing unread: closed
        assert transport.is_closing()
        client.close()

    asyncio.run(run())


def test_a_drain_leaves_an_idle_connection_open_and_answers_its_next_request_with_close():
    async def run() -> None:
        drain = Drain()
        protocol, transport, client, state = await _connect(drain)
        client.send(REQUEST)
        assert b"connection: close" not in await _answer(client)  # kept alive, then idle
        drain.begin(state.connections)
        protocol.shutdown()  # as uvicorn does when it closes the listener
        await asyncio.sleep(0.05)
        assert not transport.is_closing()
        client.send(REQUEST)
        assert b"connection: close" in await _answer(client)
        await asyncio.sleep(0.05)
        assert transport.is_closing()
        client.close()

    asyncio.run(run())
