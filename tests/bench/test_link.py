"""bench.harness.link: the shaper's bucket, and requests that start on an emptied bucket."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from httpcore._backends.sync import SyncStream

from bench.harness import link
from bench.harness.link import FRAME_BYTES, ShapedLink, burst_bytes, idle_gap_s


class _Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Recorder:
    """Stands in for the link's UDP socket: records each filler datagram."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        self.events.append(f"filler {len(data)} {addr[1]}")


@pytest.fixture
def echo_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_the_bucket_is_one_packet_on_slow_links_and_two_frames_above():
    assert burst_bytes(1.0) == burst_bytes(20.0) == 1600
    assert burst_bytes(100.0) == 2 * FRAME_BYTES
    assert idle_gap_s(1.0) > idle_gap_s(100.0) > 0.001  # the bucket's refill time + 1 ms


def test_a_quieted_request_empties_the_bucket_right_before_its_first_write(monkeypatch, echo_url):
    events: list[str] = []
    monkeypatch.setattr(link.time, "sleep", lambda s: events.append(f"sleep {s}"))
    wire = ShapedLink(100.0)
    sink = wire._filler.address
    wire.close()
    monkeypatch.setattr(wire._filler, "sock", _Recorder(events))
    socket_write = SyncStream.write

    def write(self: SyncStream, buffer: bytes, timeout: float | None = None) -> None:
        events.append("socket write")  # the bytes leaving for the wire
        socket_write(self, buffer, timeout)

    monkeypatch.setattr(SyncStream, "write", write)
    with wire.client(timeout=5) as client:
        assert client.post(echo_url, content=b"a" * 3000).content == b"a" * 3000  # not quieted
        assert not any(e.startswith("filler") for e in events)
        events.clear()
        wire.quiet()
        assert events == [f"sleep {idle_gap_s(100.0)}"]  # nothing sent until the request
        assert client.post(echo_url, content=b"b" * 3000).content == b"b" * 3000
    frame = f"filler {FRAME_BYTES - 42} {sink[1]}"
    # both filler frames go out before the request's first byte, once; the body follows unpadded
    assert events[1:4] == [frame, frame, "socket write"]
    assert events.count(frame) == 2 and events.count("socket write") >= 2


def test_a_quiet_that_no_request_followed_does_not_outlive_a_rate_change(monkeypatch, echo_url):
    events: list[str] = []
    monkeypatch.setattr(link.time, "sleep", lambda s: None)
    monkeypatch.setattr(link, "shape", lambda rate: None)
    wire = ShapedLink(100.0)
    wire.close()
    monkeypatch.setattr(wire._filler, "sock", _Recorder(events))
    with wire.client(timeout=5) as client:
        wire.quiet()
        wire.set_rate(20.0)
        assert client.post(echo_url, content=b"d").content == b"d"
    assert events == []


def test_an_unshaped_link_neither_idles_nor_sends_filler(monkeypatch, echo_url):
    events: list[str] = []
    monkeypatch.setattr(link.time, "sleep", lambda s: events.append("sleep"))
    wire = ShapedLink(None)
    wire.close()
    monkeypatch.setattr(wire._filler, "sock", _Recorder(events))
    with wire.client(timeout=5) as client:
        wire.quiet()
        assert client.post(echo_url, content=b"c").content == b"c"
    assert events == []
