"""The segment cache's bounds on loopback (issue 52, review items 3 and 4): a download's deadline
holds for the whole transfer, its retries and their waits included, and ``.part`` files neither
pile up beyond the cache budget nor evict good segments."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from qpart.client.errors import SegmentError, ServerUnavailableError, TransferDeadlineError
from qpart.client.segment_cache import SegmentCache
from qpart.client.settings import DeviceSettings
from qpart.client.transport import Transport
from tests.client.test_hostile_server import Hostile, Route, _one_line, _send, _serve

SIZE = 100_000
BUDGET = 250_000


@pytest.fixture
def server() -> Iterator[Hostile]:
    yield from _serve(Hostile())


@pytest.fixture
def transports() -> Iterator[list[Transport]]:
    opened: list[Transport] = []
    yield opened
    for transport in opened:
        transport.close()


def _cache(server: Hostile, root: Path, opened: list[Transport], **settings: object) -> SegmentCache:
    base: dict[str, object] = {"server": server.url, "cache_dir": root, "retries": 0, "timeout_s": 1.0}
    transport = Transport(DeviceSettings(**{**base, **settings}))  # type: ignore[arg-type]
    opened.append(transport)
    return SegmentCache(root, BUDGET, transport)


def _segment(i: int) -> tuple[bytes, str]:
    data = bytes([i]) * SIZE
    return data, hashlib.sha256(data).hexdigest()


def _cut_off(body: bytes, every_s: float = 0.0, for_s: float = 0.0) -> Route:
    """Announce all of ``body``, send half of it (a byte every ``every_s`` for ``for_s`` seconds
    when ``every_s`` is set), then drop the connection."""

    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("Connection", "close")
        handler.end_headers()
        if every_s:
            stop, sent = time.monotonic() + for_s, 0
            while time.monotonic() < stop:
                handler.wfile.write(body[sent:sent + 1])
                handler.wfile.flush()
                sent += 1
                time.sleep(every_s)
        else:
            handler.wfile.write(body[:len(body) // 2])
            handler.wfile.flush()
        handler.close_connection = True

    return route


def _on_disk(root: Path) -> tuple[int, list[Path]]:
    parts = list(root.glob("*.part"))
    return sum(p.stat().st_size for p in (*root.glob("*.seg"), *parts)), parts


def test_a_segment_that_drips_then_drops_is_held_to_one_deadline_across_its_retries(server, tmp_path,
                                                                                    transports):
    data, seg_id = _segment(1)
    server.routes["/seg"] = _cut_off(data, every_s=0.05, for_s=0.8)  # each attempt ends before 1 s
    deadline_s, timeout_s = 1.0, 1.0
    cache = _cache(server, tmp_path, transports, retries=3, backoff_s=0.05, timeout_s=timeout_s,
                   transfer_deadline_s=deadline_s, transfer_min_rate_bps=1e12)
    started = time.monotonic()
    with pytest.raises(TransferDeadlineError) as exc:
        cache.get(seg_id, "/seg", size_bytes=SIZE)
    assert time.monotonic() - started <= deadline_s + timeout_s + 0.5
    assert "QPART_DEVICE_TRANSFER_DEADLINE_S" in _one_line(exc)
    assert _on_disk(tmp_path)[1] == []


def test_cut_off_downloads_leave_one_part_and_never_evict_good_segments(server, tmp_path, transports):
    cache = _cache(server, tmp_path, transports)
    good, good_id = _segment(0)
    server.routes["/good"] = lambda h: _send(h, 200, good, {"ETag": f'"{good_id}"'})
    assert cache.get(good_id, "/good", size_bytes=SIZE).data == good
    for i in range(1, 7):  # six runs, each cut off mid-segment, each on a new segment
        data, seg_id = _segment(i)
        server.routes[f"/seg{i}"] = _cut_off(data)
        with pytest.raises(ServerUnavailableError):
            cache.get(seg_id, f"/seg{i}", size_bytes=SIZE)
        on_disk, parts = _on_disk(tmp_path)
        assert [p.name for p in parts] == [f"{seg_id}.part"]  # kept to resume with Range
        assert on_disk <= BUDGET + parts[0].stat().st_size
    other, other_id = _segment(9)
    server.routes["/other"] = lambda h: _send(h, 200, other, {"ETag": f'"{other_id}"'})
    assert cache.get(other_id, "/other", size_bytes=SIZE).data == other
    assert {e.segment_id for e in cache.entries()} == {good_id, other_id}  # both fit the budget
    stray = tmp_path / f"{'c' * 64}.part"
    stray.write_bytes(b"x" * BUDGET)
    assert cache.prune() == []  # the part goes, not the good segments
    assert {e.segment_id for e in cache.entries()} == {good_id, other_id}
    assert _on_disk(tmp_path)[0] <= BUDGET


def test_wrong_bytes_are_downloaded_once_and_refused_for_what_they_are(server, tmp_path, transports):
    """A whole download whose sha256 is wrong is the server's doing: no second download (with a
    deadline of its own), and no advice to retry."""
    _, seg_id = _segment(3)
    server.routes["/seg"] = lambda h: _send(h, 200, bytes([4]) * SIZE)
    cache = _cache(server, tmp_path, transports)
    with pytest.raises(SegmentError) as exc:
        cache.get(seg_id, "/seg", size_bytes=SIZE)
    assert server.paths() == ["/seg"]
    assert "other bytes than its plan names" in _one_line(exc) and "retry" not in _one_line(exc)
    assert _on_disk(tmp_path) == (0, [])


def test_a_stale_part_is_fetched_again_once_from_zero_within_the_same_deadline(server, tmp_path,
                                                                             transports):
    data, seg_id = _segment(5)
    (tmp_path / f"{seg_id}.part").write_bytes(b"\xff" * (SIZE // 2))  # stale: not this segment's start

    def route(h: BaseHTTPRequestHandler) -> None:  # honours Range: the resumed file is half stale
        if h.headers.get("Range"):
            start = int(h.headers["Range"].removeprefix("bytes=").rstrip("-"))
            _send(h, 206, data[start:], {"Content-Range": f"bytes {start}-{SIZE - 1}/{SIZE}"})
        else:
            _send(h, 200, data)

    server.routes["/seg"] = route
    cache = _cache(server, tmp_path, transports)
    assert cache.get(seg_id, "/seg", size_bytes=SIZE).data == data
    assert server.paths() == ["/seg", "/seg"]
