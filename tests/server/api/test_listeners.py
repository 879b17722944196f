"""A listener stops new handshakes, has its queue accepted, and only then closes, resetting none
of the connections that were queued on it (ADR 0022)."""

from __future__ import annotations

import asyncio
import socket
import sys
import time

import pytest

from qpart.server.api.listeners import empty_listeners, refuse_handshakes

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a socket filter on the listener is Linux's")


def test_refused_handshakes_keep_the_queued_connections_and_end_refused():
    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    address = listener.getsockname()
    queued = socket.create_connection(address)
    queued.sendall(b"request")
    assert refuse_handshakes(listener)
    with pytest.raises(TimeoutError):  # its SYN is dropped: it waits, having written nothing
        socket.create_connection(address, timeout=0.3)
    accepted, _ = listener.accept()
    assert accepted.recv(16) == b"request"
    accepted.sendall(b"answer")
    assert queued.recv(16) == b"answer"
    listener.close()
    with pytest.raises(ConnectionRefusedError):  # its SYN retried to a closed port
        socket.create_connection(address, timeout=5)
    accepted.close()
    queued.close()


def test_every_connection_queued_at_the_close_is_accepted_and_answered():
    async def run() -> list[bytes]:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readline())
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        address = server.sockets[0].getsockname()
        # Connected and written while the loop is busy here: all of them wait in the accept queue.
        clients = [socket.create_connection(address) for _ in range(8)]
        for i, client in enumerate(clients):
            client.sendall(b"%d\n" % i)
        started = time.monotonic()
        await empty_listeners([server])
        assert time.monotonic() - started < 1.0
        server.close()
        await server.wait_closed()
        loop = asyncio.get_running_loop()
        answers = []
        for client in clients:
            client.setblocking(False)
            answers.append(await asyncio.wait_for(loop.sock_recv(client, 16), 5))
            client.close()
        return answers

    assert asyncio.run(run()) == [b"%d\n" % i for i in range(8)]
