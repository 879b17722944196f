"""One deadline per transfer, down to the socket (issue 52, finding 5, review): a server that stalls
before its status line or drips its headers one byte at a time, and one that keeps answering 503
with a Retry-After, are cut off at ``transfer_deadline_s``, for plans and for segment downloads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from qpart.client.deadline import deadline_client, transfer_deadline
from qpart.client.errors import TransferDeadlineError
from tests.client.test_hostile_server import (
    _OPEN,
    BOUND_S,
    Hostile,
    Route,
    _answers,
    _device,
    _left_in,
    _one_line,
    _segment_plan,
    _serve,
)


@pytest.fixture
def server() -> Iterator[Hostile]:
    """The device's own (hostile) server; every device a test opens is closed after it."""
    yield from _serve(Hostile())
    while _OPEN:
        _OPEN.pop().close()


def _header_drip(every_s: float, stall_s: float = 0.0) -> Route:
    """Wait ``stall_s``, send a status line, then one byte of a header every ``every_s`` seconds
    until :data:`BOUND_S`: never a whole head, and never a pause a per-read timeout would catch."""

    def route(handler: BaseHTTPRequestHandler) -> None:
        time.sleep(stall_s)
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
        handler.wfile.flush()
        stop = time.monotonic() + BOUND_S - stall_s
        while time.monotonic() < stop:
            handler.wfile.write(b"a")
            handler.wfile.flush()
            time.sleep(every_s)
        handler.close_connection = True

    return route


def _send_503(handler: BaseHTTPRequestHandler, retry_after: str) -> None:
    body = b'{"error": "busy"}'
    handler.send_response(503)
    for name, value in {"Content-Length": str(len(body)), "Retry-After": retry_after}.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


@pytest.mark.parametrize("stall_s", [0.0, 3.0], ids=["header-drip", "status-line-stall"])
def test_a_plan_whose_head_never_ends_is_cut_off_at_the_deadline(server, tmp_path, stall_s):
    server.routes["/v1/plan"] = _header_drip(0.1, stall_s)
    device = _device(server, tmp_path, transfer_deadline_s=1.0, timeout_s=30.0)
    started = time.monotonic()
    with pytest.raises(TransferDeadlineError) as exc:
        device.plan("fmnist-cnn", 0.01)
    assert time.monotonic() - started < 2.0
    assert "POST /v1/plan outlived its deadline (QPART_DEVICE_TRANSFER_DEADLINE_S)" in _one_line(exc)


def test_a_segment_whose_head_never_ends_is_cut_off_and_leaves_nothing(server, tmp_path):
    server.routes["/v1/plan"] = _answers(_segment_plan("/seg"))
    server.routes["/seg"] = _header_drip(0.1)
    device = _device(server, tmp_path, transfer_deadline_s=1.0, transfer_min_rate_bps=1e9,
                     timeout_s=30.0, retries=3)
    plan = device.plan("fmnist-cnn", 0.01)
    assert plan.segment is not None
    started = time.monotonic()
    with pytest.raises(TransferDeadlineError) as exc:
        device.fetch_segment(plan)
    assert time.monotonic() - started < 2.0
    assert f"download of segment {plan.segment.id[:12]} outlived its deadline" in _one_line(exc)
    assert _left_in(tmp_path) == []


def test_retries_and_their_waits_share_one_deadline(server, tmp_path):
    server.routes["/v1/plan"] = lambda handler: _send_503(handler, "0.5")
    device = _device(server, tmp_path, transfer_deadline_s=1.2, retries=5)
    started = time.monotonic()
    with pytest.raises(TransferDeadlineError) as exc:
        device.plan("fmnist-cnn", 0.01)
    assert time.monotonic() - started < 1.5  # 6 attempts and 5 waits of 0.5 s each would be 2.5 s
    assert "asks for a wait of" in _one_line(exc) and "503" in _one_line(exc)
    assert 2 <= len(server.paths()) <= 3


def test_an_upload_the_server_drains_slowly_is_cut_off_at_the_deadline(tmp_path):
    """A server that reads 1 MiB every 0.1 s: every socket send makes progress well within the
    timeout, so only a deadline looked at between slices can end a 60 MB upload (6 s)."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    got = [0]

    def drain() -> None:
        conn, _ = listener.accept()
        stop = time.monotonic() + BOUND_S * 2
        with conn:
            while time.monotonic() < stop:
                data = conn.recv(1 << 20)
                if not data:
                    return
                got[0] += len(data)
                time.sleep(0.1)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    device = _device(Hostile(url=f"http://127.0.0.1:{port}"), tmp_path, transfer_deadline_s=1.0,
                     timeout_s=30.0)
    started = time.monotonic()
    with pytest.raises(TransferDeadlineError) as exc:
        device.transport.request("POST", "/v1/infer", content=b"\0" * (60 << 20))
    assert time.monotonic() - started < 2.0
    assert "POST /v1/infer outlived its deadline" in _one_line(exc)
    assert got[0] < 60 << 20
    listener.close()


def test_outside_a_transfer_only_the_per_read_timeouts_hold(server):
    server.routes["/ok"] = _answers(b"{}")
    with deadline_client(base_url=server.url, timeout=5.0) as client:
        assert client.get("/ok").status_code == 200
        with transfer_deadline(time.monotonic() - 1), pytest.raises(TransferDeadlineError):
            client.get("/ok")  # a pooled connection too is held to the deadline
        assert client.get("/ok").status_code == 200  # and the pool still works after it


def test_the_deadline_backend_is_installed_in_every_transport(monkeypatch):
    from qpart.client.deadline import _DeadlineBackend

    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    with deadline_client() as client:
        pools = [client._transport, *client._mounts.values()]
        assert len(pools) >= 2  # the environment's proxy has its own transport
        assert all(isinstance(t._pool._network_backend, _DeadlineBackend)
                   for t in pools if isinstance(t, httpx.HTTPTransport))
