"""Segment cache faults over real HTTP: resume after a server kill, corrupt files refetched."""

from __future__ import annotations

import contextlib
import hashlib
import re
import socket
import struct
import threading
import time

import httpx
import pytest

from qpart.client.errors import ServerUnavailableError
from qpart.client.segment_cache import SegmentCache
from qpart.client.settings import DeviceSettings
from qpart.client.transport import Transport
from tests.conftest import LiveServer

pytestmark = pytest.mark.integration


def _largest_segment(url: str) -> dict:
    info = httpx.get(f"{url}/v1/models/fmnist-cnn").json()
    return max((p["segment"] for p in info["patterns"] if p["segment"]), key=lambda s: s["size_bytes"])


def _streamed_bytes(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    match = re.search(r'^qpart_segment_bytes_total\{model="fmnist-cnn"\} ([0-9.e+]+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


_OPEN: list[Transport] = []


@pytest.fixture(autouse=True)
def _close_transports():
    yield
    while _OPEN:
        _OPEN.pop().close()


def _cache(server_url: str, root, retries: int = 1) -> SegmentCache:
    settings = DeviceSettings(server=server_url, cache_dir=root, retries=retries, backoff_s=0.05)
    transport = Transport(settings)
    _OPEN.append(transport)
    return SegmentCache(root, 1 << 30, transport)


class ThrottlingProxy:
    """A loopback TCP proxy that forwards the server's bytes slowly; ``drop()`` resets every
    client connection at once. Killing the server and dropping its connections together is what
    a crashed server looks like to a device (without it, kernel socket buffers can still deliver
    a whole small segment after the kill)."""

    def __init__(self, upstream_port: int, bytes_per_s: int = 400_000) -> None:
        self.upstream_port = upstream_port
        self.rate = bytes_per_s
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.closed = threading.Event()
        self.clients: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def drop(self) -> None:
        for conn in self.clients:
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()  # linger 0: an RST, the data still queued is gone
        self.clients.clear()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()
                continue
            self.clients.append(client)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        try:
            while True:
                data = src.recv(8192)
                if not data:
                    break
                dst.sendall(data)
                if slow:
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


def test_killed_mid_download_then_restarted_resumes_with_range(cnn_only, tmp_path):
    server = LiveServer(cnn_only)
    server.wait_ready()
    proxy = ThrottlingProxy(server.port)
    seg = _largest_segment(server.url)
    via_proxy = f"http://127.0.0.1:{proxy.port}"
    cache = _cache(via_proxy, tmp_path)
    part = tmp_path / f"{seg['id']}.part"

    def kill_after_first_chunk(done: int, total: int) -> None:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
            proxy.drop()

    try:
        with pytest.raises(ServerUnavailableError):
            cache.get(seg["id"], seg["url"], progress=kill_after_first_chunk)
        partial = part.stat().st_size
        assert 0 < partial < seg["size_bytes"]
        restarted = LiveServer(cnn_only, port=server.port)
        restarted.wait_ready()
        try:
            fetched = _cache(via_proxy, tmp_path).get(seg["id"], seg["url"])
            assert hashlib.sha256(fetched.data).hexdigest() == seg["id"]
            assert fetched.downloaded_bytes == seg["size_bytes"] - partial  # only the rest, via Range
            assert _streamed_bytes(server.url) == seg["size_bytes"] - partial
            assert not part.exists() and (tmp_path / f"{seg['id']}.seg").is_file()
        finally:
            restarted.stop()
    finally:
        server.stop()
        proxy.close()


def test_a_corrupted_cached_segment_is_detected_and_fetched_again(cnn_only, tmp_path):
    server = LiveServer(cnn_only)
    server.wait_ready()
    try:
        seg = _largest_segment(server.url)
        cache = _cache(server.url, tmp_path)
        first = cache.get(seg["id"], seg["url"])
        assert first.downloaded_bytes == seg["size_bytes"] and not first.from_cache
        assert cache.get(seg["id"], seg["url"]).downloaded_bytes == 0  # revalidated: 304
        path = tmp_path / f"{seg['id']}.seg"
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))
        again = cache.get(seg["id"], seg["url"])
        assert again.downloaded_bytes == seg["size_bytes"]
        assert hashlib.sha256(again.data).hexdigest() == seg["id"]
        path.write_bytes(raw[:100])  # truncated
        assert cache.get(seg["id"], seg["url"]).downloaded_bytes == seg["size_bytes"]
    finally:
        server.stop()


def test_revalidation_is_a_conditional_head_so_a_200_sends_no_unbounded_body(tmp_path):
    data = b"segment bytes" * 100
    seg_id = hashlib.sha256(data).hexdigest()
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.headers.get("if-none-match")))
        if request.method == "HEAD":
            return httpx.Response(200, headers={"content-length": str(len(data))})  # no 304 support
        return httpx.Response(200, content=data)

    settings = DeviceSettings(server="http://server.test", cache_dir=tmp_path, retries=0)
    mock = httpx.Client(base_url=settings.server, transport=httpx.MockTransport(handler))
    transport = Transport(settings, mock)
    cache = SegmentCache(tmp_path, 1 << 30, transport)
    (tmp_path / f"{seg_id}.seg").write_bytes(data)
    got = cache.get(seg_id, f"/v1/segments/{seg_id}", size_bytes=len(data), max_bytes=len(data))
    assert got.data == data and not got.from_cache  # a 200: downloaded again, held to the cap
    assert seen[0] == ("HEAD", f'"{seg_id}"') and all(m != "GET" or inm is None for m, inm in seen)


def test_pruning_keeps_the_cache_under_its_limit(tmp_path):
    cache = _cache("http://127.0.0.1:9", tmp_path)
    for i in range(5):
        data = bytes([i]) * 1000
        (tmp_path / f"{hashlib.sha256(data).hexdigest()}.seg").write_bytes(data)
    removed = cache.prune(max_bytes=2500)
    assert len(removed) == 3 and sum(e.size_bytes for e in cache.entries()) <= 2500
