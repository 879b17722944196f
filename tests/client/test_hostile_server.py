"""A device against a hostile server on loopback (issue 52, findings 1, 3, 4, 5, 6): credentials and
uploads stay on the server's origin, answers are capped after decoding, segments are capped before
download, every transfer has a deadline, and server text is printed with its escapes shown."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from qpart.client.cli import device_app
from qpart.client.device import DeviceClient, HeadFunction
from qpart.client.errors import (
    AnswerTooLargeError,
    ForeignOriginError,
    SegmentRefusedError,
    ServerRejectedError,
    TransferDeadlineError,
)
from qpart.client.plans import ModelMetadata, PlanResponse
from qpart.client.settings import DeviceSettings
from tests.client.samples import PLAN

BOUND_S = 4.0
"""No answer of the hostile server lasts longer: it stops by itself."""
TOKEN = "s3cret-token"
SEGMENT = b"segment bytes " * 100
SEGMENT_ID = hashlib.sha256(SEGMENT).hexdigest()

Route = Callable[[BaseHTTPRequestHandler], None]


@dataclass
class Hostile:
    """One loopback server: its routes (path → answer) and the requests it saw (path, headers)."""

    url: str = ""
    routes: dict[str, Route] = field(default_factory=dict)
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [path for path, _ in self.seen]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hostile: Hostile

    def _answer(self) -> None:
        self.hostile.seen.append((self.path, dict(self.headers)))
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        route = self.hostile.routes.get(self.path.split("?")[0])
        try:
            if route is None:
                _send(self, 404, json.dumps({"error": "no such route"}).encode())
            else:
                route(self)
        except OSError:
            pass  # the device hung up

    do_GET = do_POST = do_HEAD = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes,
          headers: dict[str, str] | None = None) -> None:
    handler.send_response(status)
    for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
        handler.send_header(name, value)
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def _drip(first: bytes, every_s: float, piece: bytes = b" ", length: int | None = None) -> Route:
    """Send ``first``, then ``piece`` every ``every_s`` seconds until :data:`BOUND_S` (an endless
    body when ``every_s`` is 0: as fast as the device reads)."""

    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Connection", "close")
        if length is not None:
            handler.send_header("Content-Length", str(length))
        handler.end_headers()
        handler.wfile.write(first)
        stop = time.monotonic() + BOUND_S
        while time.monotonic() < stop:
            handler.wfile.write(piece)
            handler.wfile.flush()
            if every_s:
                time.sleep(every_s)
        handler.close_connection = True

    return route


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a device hanging up is expected
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def _serve(state: Hostile) -> Iterator[Hostile]:
    httpd = _Server(("127.0.0.1", 0), type("Handler", (_Handler,), {"hostile": state}))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def server() -> Iterator[Hostile]:
    """The device's own (hostile) server."""
    yield from _serve(Hostile())


@pytest.fixture
def foreign() -> Iterator[Hostile]:
    """Another origin (another port on loopback), which a plan may name."""
    yield from _serve(Hostile())


class _Device(DeviceClient):
    """A device whose head is the identity: only the transfers matter here."""

    def load_head(self, plan: PlanResponse, segment: bytes | None) -> HeadFunction:
        return lambda x: x


_OPEN: list[_Device] = []


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    """Every device a test opens is closed (its connections with it)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def _device(server: Hostile, tmp_path: Path, **settings: object) -> _Device:
    base: dict[str, object] = {"server": server.url, "token": TOKEN, "cache_dir": tmp_path / "cache",
                               "retries": 0, "timeout_s": 2.0}
    device = _Device(DeviceSettings(**{**base, **settings}))  # type: ignore[arg-type]
    _OPEN.append(device)
    return device


def _plan(**changes: object) -> bytes:
    return json.dumps({**PLAN, **changes}).encode()


def _segment_plan(url: str, size_bytes: int = len(SEGMENT)) -> bytes:
    segment = {"id": SEGMENT_ID, "url": url, "size_bytes": size_bytes, "sha256": SEGMENT_ID,
               "held": False}
    return _plan(cut=1, segment=segment)


def _answers(body: bytes, headers: dict[str, str] | None = None) -> Route:
    return lambda handler: _send(handler, 200, body, {"Content-Type": "application/json", **(headers or {})})


def _left_in(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache").glob("*") if p.suffix in (".seg", ".part"))


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and "\r" not in text
    return text


def test_a_foreign_infer_url_is_refused_before_anything_is_sent_there(server, foreign, tmp_path):
    server.routes["/v1/plan"] = _answers(_plan(infer_url=f"{foreign.url}/v1/infer"))
    device = _device(server, tmp_path)
    with pytest.raises(ForeignOriginError) as exc:
        device.infer(np.zeros((1, 1, 28, 28), np.float32), "fmnist-cnn", 0.01)
    assert foreign.url.removeprefix("http://") in _one_line(exc)
    assert "TRUSTED_SEGMENT_HOSTS" not in _one_line(exc)  # no such setting for uploads
    assert foreign.seen == []  # neither the token nor the activation went there
    assert server.seen[0][1].get("Authorization") == f"Bearer {TOKEN}"  # the server's own origin has it


def test_a_segment_on_an_untrusted_origin_is_refused(server, foreign, tmp_path):
    foreign.routes["/seg"] = _answers(SEGMENT)
    server.routes["/v1/plan"] = _answers(_segment_plan(f"{foreign.url}/seg"))
    device = _device(server, tmp_path)
    with pytest.raises(ForeignOriginError) as exc:
        device.infer(np.zeros((1, 1, 28, 28), np.float32), "fmnist-cnn", 0.01)
    assert "QPART_DEVICE_TRUSTED_SEGMENT_HOSTS" in _one_line(exc)
    assert foreign.seen == [] and _left_in(tmp_path) == []


def test_a_segment_on_a_trusted_host_is_fetched_without_credentials(server, foreign, tmp_path):
    foreign.routes["/seg"] = lambda h: _send(h, 200, SEGMENT, {"ETag": f'"{SEGMENT_ID}"'})
    server.routes["/v1/plan"] = _answers(_segment_plan(f"{foreign.url}/seg"))
    device = _device(server, tmp_path, trusted_segment_hosts=(foreign.url,))
    plan = device.plan("fmnist-cnn", 0.01)
    assert device.fetch_segment(plan) == (SEGMENT, len(SEGMENT))
    assert device.fetch_segment(plan)[0] == SEGMENT  # from the cache, revalidated with a HEAD there
    assert [h.get("If-None-Match") for _, h in foreign.seen][:2] == [None, f'"{SEGMENT_ID}"']
    assert all("Authorization" not in headers for _, headers in foreign.seen)


def test_a_gzip_bomb_plan_is_refused_at_the_cap_once_decoded(server, tmp_path):
    bomb = gzip.compress(_plan() + b" " * (64 << 20), compresslevel=9)  # valid JSON, 64 MiB decoded
    assert len(bomb) < 200_000
    server.routes["/v1/plan"] = _answers(bomb, {"Content-Encoding": "gzip"})
    device = _device(server, tmp_path, answer_max_bytes=1 << 20)
    with pytest.raises(AnswerTooLargeError) as exc:
        device.plan("fmnist-cnn", 0.01)
    assert "over 1048576 bytes once decoded" in _one_line(exc)


def test_an_endless_answer_ends_at_the_cap(server, tmp_path):
    server.routes["/v1/plan"] = _drip(_plan(), 0.0, b" " * 4096)
    device = _device(server, tmp_path, answer_max_bytes=256 << 10)
    started = time.monotonic()
    with pytest.raises(AnswerTooLargeError) as exc:
        device.plan("fmnist-cnn", 0.01)
    assert time.monotonic() - started < BOUND_S / 2
    assert "QPART_DEVICE_ANSWER_MAX_BYTES" in _one_line(exc)


def test_a_dripping_answer_is_cut_off_at_the_deadline(server, tmp_path):
    server.routes["/v1/plan"] = _drip(_plan(), 0.1)
    device = _device(server, tmp_path, transfer_deadline_s=1.0)
    started = time.monotonic()
    with pytest.raises(TransferDeadlineError) as exc:
        device.plan("fmnist-cnn", 0.01)
    assert time.monotonic() - started < 2.5
    assert "QPART_DEVICE_TRANSFER_DEADLINE_S" in _one_line(exc)


def test_a_dripping_segment_is_cut_off_at_the_deadline_and_leaves_nothing(server, tmp_path):
    server.routes["/v1/plan"] = _answers(_segment_plan("/seg"))
    server.routes["/seg"] = _drip(SEGMENT[:10], 0.1, SEGMENT[10:11], length=len(SEGMENT))
    device = _device(server, tmp_path, transfer_deadline_s=1.0, transfer_min_rate_bps=1e9)
    plan = device.plan("fmnist-cnn", 0.01)
    started = time.monotonic()
    with pytest.raises(TransferDeadlineError) as exc:
        device.fetch_segment(plan)
    assert time.monotonic() - started < 2.5
    _one_line(exc)
    assert _left_in(tmp_path) == []


def test_a_torch_device_refuses_a_50_gib_segment_before_downloading_it(server, tmp_path):
    server.routes["/v1/plan"] = _answers(_segment_plan("/seg", size_bytes=50 << 30))
    server.routes["/seg"] = _drip(b"", 0.0, b"\0" * 65536, length=50 << 30)
    device = _device(server, tmp_path)  # the default segment_max_bytes
    plan = device.plan("fmnist-cnn", 0.01)
    with pytest.raises(SegmentRefusedError) as exc:
        device.fetch_segment(plan)
    assert "QPART_DEVICE_SEGMENT_MAX_BYTES" in _one_line(exc)
    assert "/seg" not in server.paths() and _left_in(tmp_path) == []


def test_part_files_count_in_the_cache_budget_and_stale_ones_go_when_it_opens(server, tmp_path):
    from qpart.client.segment_cache import PART_STALE_S

    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    stale = cache_dir / f"{'a' * 64}.part"
    stale.write_bytes(b"x" * 1000)
    old = time.time() - PART_STALE_S - 1
    os.utime(stale, (old, old))
    fresh = cache_dir / f"{'b' * 64}.part"
    fresh.write_bytes(b"y" * 700)
    device = _device(server, tmp_path)
    assert not stale.exists() and fresh.exists()  # a crash's leftover is gone when the cache opens
    assert device.cache.part_bytes() == 700


def _cli_runtime(monkeypatch, labels: list[str], failure: Exception | None) -> None:
    """``qpart device infer``'s runtime answering in a hostile server's place."""

    class Runtime:
        def __init__(self, settings, **_):
            pass

        def infer(self, *_, **__):
            from qpart.client.device import InferenceRun
            from qpart.client.plans import PlanResponse

            if failure is not None:
                raise failure
            plan = PlanResponse.model_validate(PLAN)
            return InferenceRun(plan, predictions=[0, 1], timings_s={"total": 0.01})

        def metadata(self, model):
            return ModelMetadata(parameters={"labels": json.dumps(labels)})

        def close(self):
            pass

    module = ModuleType("qpart.client.runtime")
    module.DeviceRuntime = Runtime  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "qpart.client.runtime", module)


ESCAPES = "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07\x1b[2J\rforged\nline\x9b"


@pytest.mark.parametrize("where", ["label", "error"])
def test_server_text_is_printed_with_its_control_characters_escaped(monkeypatch, tmp_path, where):
    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(image)
    failure = ServerRejectedError(400, ESCAPES) if where == "error" else None
    _cli_runtime(monkeypatch, [ESCAPES, "ok"], failure)
    result = CliRunner().invoke(device_app, ["infer", str(image), str(image)],
                                env={"QPART_DEVICE_CACHE_DIR": str(tmp_path / "cache"),
                                     "QPART_DEVICE_OFFER_INPUT_IMAGE": "false"})
    said = result.output
    assert not any(c in said for c in "\x1b\x07\r\x9b")
    assert "\\x1b]8;;http://evil.example\\x07click" in said and "\\rforged\\nline\\x9b" in said
    line = next(li for li in said.splitlines() if "evil" in li)
    assert line.startswith("error: " if where == "error" else "predictions: 0 (")
