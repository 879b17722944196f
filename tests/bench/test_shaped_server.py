"""bench.harness.shaped_server: answers leave on a bucket emptied of what it saved while the server worked."""

from __future__ import annotations

import asyncio
import socket
import time

from bench.harness import link, shaped_server
from bench.harness.link import FRAME_BYTES, UDP_OVERHEAD, Filler
from bench.harness.shaped_server import ResponseFiller


class _Recorder:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        self.events.append(f"filler {len(data) + UDP_OVERHEAD}")


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _order(port: int, text: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(text.encode(), ("127.0.0.1", port))
    time.sleep(0.05)


def test_spend_sends_whole_frames_then_the_remainder_and_drops_what_no_frame_can_carry():
    events: list[str] = []
    filler = Filler()
    filler.close()
    filler.sock = _Recorder(events)  # type: ignore[assignment]
    filler.spend(1600)
    assert events == [f"filler {FRAME_BYTES}", "filler 86"]
    events.clear()
    filler.spend(59)
    assert events == []


def test_the_bucket_saves_rate_times_idle_time_up_to_its_size_and_nothing_unshaped():
    port = _free_udp_port()
    filler = ResponseFiller(lambda *a: None, port)  # type: ignore[arg-type]
    assert filler.saved_bytes(1.0) == 0  # no order yet: unshaped
    _order(port, "5.0 1600")
    assert filler.saved_bytes(0.001) == 625  # 5 Mbit/s for 1 ms
    assert filler.saved_bytes(1.0) == 1600  # capped by the bucket
    _order(port, "0 0")
    assert filler.saved_bytes(1.0) == 0
    filler.close()


def test_the_filler_goes_out_before_the_answer_sized_by_the_time_since_the_body_arrived(monkeypatch):
    port = _free_udp_port()
    events: list[str] = []
    clock = iter([10.000, 10.002, 10.0032])  # request starts, body read, answer starts 1.2 ms later

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    filler = ResponseFiller(app, port)
    filler._filler.sock.close()
    monkeypatch.setattr(filler._filler, "sock", _Recorder(events))
    monkeypatch.setattr(shaped_server.time, "perf_counter", lambda: next(clock))
    _order(port, "1.0 1600")

    async def receive():
        return {"type": "http.request", "body": b"x", "more_body": False}

    async def send(message):
        events.append(message["type"])

    asyncio.run(filler({"type": "http"}, receive, send))
    monkeypatch.undo()
    filler.close()
    # 1.2 ms at 1 Mbit/s: 150 B saved, spent as one 150 B frame right before the answer
    assert events == ["filler 150", "http.response.start", "http.response.body"]


def test_the_body_counts_as_arrived_at_its_last_chunk_and_bad_orders_are_ignored(monkeypatch):
    port = _free_udp_port()
    events: list[str] = []
    # each chunk arrives 1 ms after the one before; the answer starts 0.8 ms after the last
    now = [10.0]
    chunks = iter([{"type": "http.request", "body": b"a", "more_body": True},
                   {"type": "http.request", "body": b"b", "more_body": False}])

    async def app(scope, receive, send):
        await receive()
        await receive()
        now[0] += 0.0008
        await send({"type": "http.response.start", "status": 200, "headers": []})

    filler = ResponseFiller(app, port)
    filler._filler.sock.close()
    monkeypatch.setattr(filler._filler, "sock", _Recorder(events))
    monkeypatch.setattr(shaped_server.time, "perf_counter", lambda: now[0])
    _order(port, "1.0 1600")
    _order(port, "not an order")

    async def receive():
        now[0] += 0.001
        return next(chunks)

    async def send(message):
        events.append(message["type"])

    asyncio.run(filler({"type": "http"}, receive, send))
    assert events == ["filler 100", "http.response.start"]  # 0.8 ms at 1 Mbit/s, not 1.8 ms
    monkeypatch.undo()
    filler.close()


def test_a_rate_change_orders_the_server_layer(monkeypatch):
    port = _free_udp_port()
    monkeypatch.setattr(link, "shape", lambda rate: None)
    monkeypatch.setattr(link.time, "sleep", lambda s: None)
    filler = ResponseFiller(lambda *a: None, port)  # type: ignore[arg-type]
    wire = link.ShapedLink(server_control_port=port)
    wire.set_rate(5.0)
    time.sleep(0.05)
    assert filler.saved_bytes(1.0) == link.burst_bytes(5.0)
    wire.set_rate(None)
    time.sleep(0.05)
    assert filler.saved_bytes(1.0) == 0
    wire.close()
    filler.close()
