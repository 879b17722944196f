"""One write per small response: a held header block goes out with the next write, or at the end of
the loop's pass; order is kept; close flushes, abort drops."""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import uvicorn

from server.transport import CoalescingHttpToolsProtocol, CoalescingTransport


class _Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def writelines(self, chunks) -> None:
        self.writes.append(b"".join(chunks))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def _run(check):
    async def main():
        loop = asyncio.get_running_loop()
        raw = _Recorder()
        await check(CoalescingTransport(raw, loop), raw)  # type: ignore[arg-type]

    asyncio.run(main())


def test_headers_and_body_go_out_as_one_write():
    async def check(t, raw):
        t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        assert raw.writes == [] and t.get_write_buffer_size() == 38
        t.write(memoryview(b"{}"))
        assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
        await asyncio.sleep(0)  # the scheduled flush finds nothing held
        assert len(raw.writes) == 1

    _run(check)


def test_a_header_block_with_no_body_goes_out_at_the_end_of_the_pass():
    async def check(t, raw):
        t.write(b"HTTP/1.1 304 Not Modified\r\n\r\n")
        assert raw.writes == []
        await asyncio.sleep(0)
        assert raw.writes == [b"HTTP/1.1 304 Not Modified\r\n\r\n"]

    _run(check)


def test_other_writes_pass_straight_through_in_order():
    async def check(t, raw):
        t.write(b"chunk one")
        t.write(b"head\r\n\r\n")
        t.write(b"chunk two")
        t.write(b"chunk three")
        assert raw.writes == [b"chunk one", b"head\r\n\r\nchunk two", b"chunk three"]
        assert t.get_extra_info("peername") == "info:peername"

    _run(check)


def test_close_sends_what_is_held_and_abort_drops_it():
    async def check(t, raw):
        t.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        t.close()
        assert raw.writes == [b"HTTP/1.1 204 No Content\r\n\r\n"] and raw.closed

    _run(check)

    async def check_abort(t, raw):
        t.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        t.abort()
        await asyncio.sleep(0)
        assert raw.writes == [] and raw.aborted

    _run(check_abort)


def test_a_real_uvicorn_server_answers_through_it():
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b"x" * (5 if scope["path"] == "/small" else 300_000)
        status = 304 if scope["path"] == "/empty" else 200
        if status == 304:
            body = b""
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        if scope["path"] == "/stream":  # several body messages, the later ones after a pause
            await send({"type": "http.response.body", "body": body[:1000], "more_body": True})
            await asyncio.sleep(0.01)
            await send({"type": "http.response.body", "body": body[1000:]})
        else:
            await send({"type": "http.response.body", "body": body})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           http=CoalescingHttpToolsProtocol, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            threading.Event().wait(0.01)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
            for _ in range(3):  # keep-alive: several responses on one connection
                assert c.get("/small").content == b"xxxxx"
                assert c.get("/empty").status_code == 304
                assert c.get("/stream").content == b"x" * 300_000
                assert c.get("/big").content == b"x" * 300_000
    finally:
        server.should_exit = True
        thread.join(10)
