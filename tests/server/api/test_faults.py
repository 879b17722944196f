"""The fault suite (issue 8), over a live server on loopback: SIGTERM under load, corrupted artifacts
at start, clients hanging up mid-stream, oversize and slow bodies, garbage on every binary route."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import LiveServer, TailLoad, tail_request

pytestmark = pytest.mark.integration
MAX_BODY_BYTES = 64 << 10
BODY_TIMEOUT_S = 1.0
IO_TIMEOUT_S = 15.0  # no single answer may take longer: a hang fails instead of blocking the suite
MODELS = ("fmnist-cnn", "fmnist-resnet")
OIP = "/v2/models/fmnist-cnn/infer"


# ---- helpers: raw HTTP, process resources, metrics -------------------------------------------


@dataclass(frozen=True)
class RawResponse:
    """A response read off a raw socket."""

    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> str:
        """The message of the ``{"error": ...}`` body every error carries."""
        doc = json.loads(self.body)
        assert isinstance(doc, dict) and set(doc) == {"error"} and doc["error"], doc
        return str(doc["error"])


def parse_response(data: bytes) -> RawResponse:
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep, f"no complete response head in {data[:200]!r}"
    lines = head.decode("latin-1").split("\r\n")
    fields = (line.partition(":") for line in lines[1:])
    headers = {name.strip().lower(): value.strip() for name, _, value in fields}
    return RawResponse(int(lines[0].split()[1]), headers, body[: int(headers.get("content-length", 0))])


def connect(server: LiveServer, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:  # before connect, or the window is already agreed
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(IO_TIMEOUT_S)
    sock.connect(("127.0.0.1", server.port))
    return sock


def request_head(method: str, path: str, headers: dict[str, str] | None = None) -> bytes:
    fields = [f"{name}: {value}" for name, value in (headers or {}).items()]
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def read_response(sock: socket.socket) -> RawResponse:
    """One response with a Content-Length body (the socket's timeout bounds every wait)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        if b"\r\n\r\n" in data:
            response = parse_response(data)
            if len(response.body) >= int(response.headers.get("content-length", 0)):
                return response
    return parse_response(data)


def hang_up(sock: socket.socket, reset: bool) -> None:
    """Close abruptly: with ``reset`` an RST at once (a killed client), else a FIN."""
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def fds_and_threads(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^Threads:\s+(\d+)$", status, re.M)
    assert match, status
    return len(os.listdir(f"/proc/{pid}/fd")), int(match.group(1))


def samples(url: str, sample: str, **labels: str) -> list[float]:
    """The values of a metric's samples that carry ``labels``."""
    text = httpx.get(f"{url}/metrics", timeout=IO_TIMEOUT_S).text
    return [s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == sample and labels.items() <= s.labels.items()]


def metric(url: str, sample: str, **labels: str) -> float:
    return sum(samples(url, sample, **labels))


def in_flight_besides_scrape(url: str) -> float:
    # The scrape that reads the gauge is itself a request in flight.
    return metric(url, "qpart_in_flight_requests") - 1


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def strict_server(cnn_only: Path) -> Iterator[LiveServer]:
    """The server the client-fault tests share: a 64 KiB body limit and a 1 s body timeout."""
    server = LiveServer(cnn_only, env={"QPART_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
                                       "QPART_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S)})
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tail(strict_server: LiveServer) -> tuple[str, bytes]:
    return tail_request(strict_server.url)


@pytest.fixture(scope="module")
def model_info(strict_server: LiveServer) -> dict:
    return httpx.get(f"{strict_server.url}/v1/models/fmnist-cnn", timeout=IO_TIMEOUT_S).json()


def assert_serves(server: LiveServer, tail: tuple[str, bytes]) -> None:
    infer_url, packet = tail
    answer = httpx.post(f"{server.url}{infer_url}", content=packet, timeout=IO_TIMEOUT_S)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["results"]) == 1


def server_errors(url: str) -> float:
    return metric(url, "qpart_requests_total", outcome="server_error")


# ---- 1. SIGTERM under load -------------------------------------------------------------------

DRAIN_S = 3.0
GRACEFUL_S = 10.0


class ReadinessWatcher:
    """Polls /v2/health/ready and keeps the moment its first 503 arrived: an upper bound of the
    flip, so "sent before it" covers every request sent before the real flip, and a little more."""

    def __init__(self, url: str, interval_s: float = 0.05) -> None:
        self.flipped_at: float | None = None
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(url, interval_s), daemon=True)
        self._thread.start()

    def _poll(self, url: str, interval_s: float) -> None:
        with httpx.Client(base_url=url, timeout=IO_TIMEOUT_S) as client:
            while not self._stop.is_set():
                try:
                    status = client.get("/v2/health/ready").status_code
                except httpx.TransportError as exc:
                    self.error = repr(exc)
                    return
                if status == 503:
                    self.flipped_at = time.monotonic()
                    return
                self._stop.wait(interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(IO_TIMEOUT_S)


def test_sigterm_under_load_answers_every_request_sent_before_readiness_flipped(cnn_only):
    server = LiveServer(cnn_only, env={"QPART_DRAIN_DELAY_S": str(DRAIN_S),
                                       "QPART_GRACEFUL_TIMEOUT_S": str(GRACEFUL_S)})
    server.wait_ready()
    load = TailLoad(server.url, *tail_request(server.url, batch=4), clients=16)
    watcher = ReadinessWatcher(server.url)
    try:
        wait_until(lambda: len(load.statuses()) >= 64, 60, "64 answers under load")
        signalled_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            code = server.proc.wait(DRAIN_S + GRACEFUL_S + 10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {DRAIN_S + GRACEFUL_S + 10} s after SIGTERM")
        exited_after = time.monotonic() - signalled_at
    finally:
        load.stop()
        watcher.stop()
        log = server.stop()
    flipped_at = watcher.flipped_at
    assert flipped_at is not None, f"readiness never answered 503 ({watcher.error})"
    # It flipped while the server still served: a balancer had the drain window to react.
    assert flipped_at - signalled_at < DRAIN_S
    before = [o for o in load.outcomes if o.sent_at < flipped_at]
    assert len(before) >= 64
    assert any(o.sent_at < signalled_at < o.done_at for o in before)  # the signal came mid-load
    lost = [o for o in before if o.status != 200]
    assert not lost, lost[:5]
    assert set(load.statuses()) == {200}  # nothing answered during the drain was refused either
    assert code == 0, log[-3000:]
    assert exited_after <= DRAIN_S + GRACEFUL_S


# ---- 2. a corrupted artifact at start --------------------------------------------------------


def flip_weight_bytes(folder: Path) -> None:
    weights = folder / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    weights.write_bytes(bytes(data))


def truncate_artifact(folder: Path) -> None:
    artifact = folder / "artifact.json"
    artifact.write_bytes(artifact.read_bytes()[: artifact.stat().st_size // 3])


def garble_artifact(folder: Path) -> None:
    (folder / "artifact.json").write_bytes(random.Random(8).randbytes(4096))


@pytest.mark.parametrize(("broken", "corrupt", "reason"), [
    pytest.param("fmnist-resnet", flip_weight_bytes, r"its weights hash to [0-9a-f]{12}, "
                 r"the artifact was calibrated for [0-9a-f]{12}", id="flipped-weight-bytes"),
    pytest.param("fmnist-cnn", truncate_artifact, r"artifact\.json is not a valid calibration artifact",
                 id="truncated-artifact-json"),
    pytest.param("fmnist-resnet", garble_artifact, r"artifact\.json is not a valid calibration artifact",
                 id="garbled-artifact-json"),
])
def test_a_corrupted_artifact_is_not_ready_with_its_reason_while_the_other_model_serves(
        artifacts_dir, tmp_path, broken, corrupt, reason):
    for name in MODELS:
        shutil.copytree(artifacts_dir / name, tmp_path / name)
    corrupt(tmp_path / broken)
    healthy = next(name for name in MODELS if name != broken)
    server = LiveServer(tmp_path)
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=IO_TIMEOUT_S) as c:
            # Asked by its folder's name, which is all the server knows of an unreadable artifact.
            answer = c.get(f"/v2/models/{broken}/ready")
            assert answer.status_code == 503
            assert set(answer.json()) == {"error"}
            assert re.search(reason, answer.json()["error"]), answer.json()
            assert str(tmp_path) not in answer.json()["error"]  # no server path to anyone who asks
            plan = c.post("/v1/plan", json={"model": broken, "accuracy_demand": 0.01, "rate_bps": 1e6})
            assert plan.status_code == 503 and re.search(reason, plan.json()["error"]), plan.text
            assert c.get(f"/v2/models/{healthy}/ready").json() == {"name": healthy, "ready": True}
        assert samples(server.url, "qpart_model_ready", model=broken) == [0]
        assert samples(server.url, "qpart_model_ready", model=healthy) == [1]
        infer_url, packet = tail_request(server.url, model=healthy)
        answer = httpx.post(f"{server.url}{infer_url}", content=packet, timeout=IO_TIMEOUT_S)
        assert answer.status_code == 200 and answer.json()["model"] == healthy, answer.text
    finally:
        log = server.stop()
    assert re.search(f"model {broken} version .*: NOT READY", log), log[-3000:]
    assert str(tmp_path / broken) in log  # the operator's log says which file is broken


# ---- 3. clients hanging up mid-stream --------------------------------------------------------


def largest_segment(model_info: dict) -> dict:
    return max((p["segment"] for p in model_info["patterns"] if p["segment"]), key=lambda s: s["size_bytes"])


def pipelined_to_stall(size_bytes: int) -> int:
    """GETs to pipeline so the server's socket buffers cannot hold every response: one stays
    blocked inside the app, mid-stream (a single 1.8 MB response fits the kernel's buffers whole)."""
    send_buffer_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    return send_buffer_max // size_bytes + 2


def abandon_downloads(server: LiveServer, segment: dict, times: int) -> None:
    pipelined = pipelined_to_stall(segment["size_bytes"])
    for i in range(times):
        sock = connect(server, rcvbuf=4096)
        sock.sendall(request_head("GET", segment["url"]) * (pipelined if i % 2 else 1))
        received = 0
        while received < 64 << 10:  # part of the first response, then gone
            chunk = sock.recv(16384)
            assert chunk, "the server closed a download"
            received += len(chunk)
        if i == 1:  # the premise: a response is stuck in the app, not only in kernel buffers
            wait_until(lambda: in_flight_besides_scrape(server.url) >= 1, 10, "a download stalled mid-stream")
        hang_up(sock, reset=i % 4 < 2)


def abandon_uploads(server: LiveServer, tail: tuple[str, bytes]) -> None:
    infer_url, packet = tail
    for i, path in enumerate([infer_url, OIP, "/v1/plan"] * 5):  # mid-body
        sock = connect(server)
        sock.sendall(request_head("POST", path, {"Content-Length": "50000"}) + b"\0" * 1000)
        hang_up(sock, reset=i % 2 == 1)
    for i in range(6):  # a whole request, gone before its answer
        sock = connect(server)
        sock.sendall(request_head("POST", infer_url, {"Content-Length": str(len(packet))}) + packet)
        hang_up(sock, reset=i % 2 == 1)


def test_clients_hanging_up_mid_download_or_mid_upload_leak_nothing(strict_server, tail, model_info):
    url, pid = strict_server.url, strict_server.proc.pid
    segment = largest_segment(model_info)

    def download() -> None:
        answer = httpx.get(f"{url}{segment['url']}", timeout=IO_TIMEOUT_S)
        assert answer.status_code == 200 and hashlib.sha256(answer.content).hexdigest() == segment["sha256"]

    # Warm up what legitimately stays: cached segment, worker threads of concurrent streams, tail pool.
    warm = [threading.Thread(target=download) for _ in range(4)]
    for thread in warm:
        thread.start()
    for thread in warm:
        thread.join(IO_TIMEOUT_S)
    assert_serves(strict_server, tail)
    errors_before = server_errors(url)
    time.sleep(0.5)  # the warm-up's connections close on the server's side
    base_fds, base_threads = fds_and_threads(pid)

    abandon_downloads(strict_server, segment, times=30)
    abandon_uploads(strict_server, tail)

    def settled() -> bool:
        fds, threads = fds_and_threads(pid)
        return fds <= base_fds + 2 and threads <= base_threads + 2 and in_flight_besides_scrape(url) == 0

    deadline = time.monotonic() + 10
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert settled(), (f"fds, threads {fds_and_threads(pid)} (before: {base_fds}, {base_threads}); "
                       f"in flight besides the scrape: {in_flight_besides_scrape(url)}")
    # A client hanging up is not a server error (it was one: ClientDisconnect became a 500).
    assert server_errors(url) == errors_before
    download()
    assert_serves(strict_server, tail)


# ---- 4. oversize and slow bodies -------------------------------------------------------------

ROUTES = ["tail", OIP, "/v1/plan"]


def route_path(route: str, tail: tuple[str, bytes]) -> str:
    return tail[0] if route == "tail" else route


@pytest.mark.parametrize("route", ROUTES)
def test_an_honest_content_length_over_the_limit_is_a_413_before_the_body(strict_server, tail, route):
    with connect(strict_server) as sock:
        sock.sendall(request_head("POST", route_path(route, tail), {
            "Content-Length": str(MAX_BODY_BYTES + 1), "Content-Type": "application/json"}))
        response = read_response(sock)  # no body byte sent: the header alone is refused
    assert response.status == 413
    assert f"limit of {MAX_BODY_BYTES} bytes" in response.error()
    assert_serves(strict_server, tail)


@pytest.mark.parametrize("route", ROUTES)
def test_a_chunked_body_growing_past_the_limit_is_a_413(strict_server, tail, route):
    chunk = b"2000\r\n" + b"\0" * 0x2000 + b"\r\n"
    chunks = MAX_BODY_BYTES // 0x2000 + 1  # just past the limit; no last chunk: no size is ever declared
    with connect(strict_server) as sock:
        sock.sendall(request_head("POST", route_path(route, tail),
                                  {"Transfer-Encoding": "chunked", "Content-Type": "application/json"})
                     + chunk * chunks)
        response = read_response(sock)
    assert response.status == 413
    assert f"limit of {MAX_BODY_BYTES} bytes" in response.error()
    assert response.headers.get("connection") == "close"  # the rest of the body is not read
    assert_serves(strict_server, tail)


@dataclass(frozen=True)
class Trickle:
    data: bytes
    answered_after: float | None
    closed_after: float | None


def trickle(sock: socket.socket, seconds: float, interval_s: float = 0.05) -> Trickle:
    """Send a byte per interval; note when an answer came and when the server closed."""
    started = time.monotonic()
    data, answered, closed = b"", None, None
    while closed is None and time.monotonic() - started < seconds:
        if not select.select([sock], [], [], interval_s)[0]:
            try:
                sock.send(b"{")
                continue
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server is gone; what it answered before is still there to read
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if chunk and answered is None:
            answered = time.monotonic() - started
        if not chunk:
            closed = time.monotonic() - started
        data += chunk
    return Trickle(data, answered, closed)


@pytest.mark.parametrize("route", ROUTES)
def test_a_body_trickled_slower_than_the_timeout_is_a_408_and_the_connection_closes(
        strict_server, tail, route):
    with connect(strict_server) as sock:
        sock.sendall(request_head("POST", route_path(route, tail),
                                  {"Content-Length": "4096", "Content-Type": "application/json"}))
        result = trickle(sock, BODY_TIMEOUT_S + 10)
    assert result.answered_after is not None, "no answer to a body that never arrives"
    assert BODY_TIMEOUT_S * 0.9 <= result.answered_after <= BODY_TIMEOUT_S + 5
    response = parse_response(result.data)
    assert response.status == 408
    assert f"not received within {BODY_TIMEOUT_S} s" in response.error()
    # Then the server hangs up, however long the client goes on trickling (it kept reading).
    assert result.closed_after is not None and result.closed_after - result.answered_after < 5
    assert_serves(strict_server, tail)


# ---- 5. garbage on every binary route --------------------------------------------------------


def nasty_packets(valid: bytes) -> list[bytes]:
    """Hand-made hostile activation packets around a valid quantized one."""
    magic, bits, ndim, flags, group = struct.unpack_from("<4sBBHI", valid)
    dims = struct.unpack_from(f"<{ndim}I", valid, 12)
    groups = math.ceil(math.prod(dims) / group)
    scales = 12 + 4 * ndim

    def with_head(**change: int) -> bytes:
        fields = {"bits": bits, "ndim": ndim, "flags": flags, "group": group, **change}
        return struct.pack("<4sBBHI", magic, *fields.values()) + valid[12:]

    def with_scales(value: float) -> bytes:
        return valid[:scales] + struct.pack("<f", value) * groups + valid[scales + 4 * groups:]

    return [
        b"", b"Q", b"QPA", magic, magic + b"\0" * 8, b"QPA\x02" + valid[4:], b"\0" * len(valid),
        valid[:12], valid[:-1], valid[: len(valid) // 2], valid + b"\0", valid * 2,
        with_head(bits=0), with_head(bits=9), with_head(bits=255), with_head(bits=32), with_head(ndim=0),
        with_head(ndim=9), with_head(ndim=255), with_head(flags=1), with_head(group=0),
        with_head(group=0xFFFFFFFF), valid[:12] + b"\xff" * (len(valid) - 12),
        valid[:12] + struct.pack("<I", 0) + valid[16:],
        valid[:12] + struct.pack("<I", 0xFFFFFFFF) + valid[16:],
        with_scales(float("nan")), with_scales(float("inf")), with_scales(-1.0), with_scales(0.0),
        with_scales(3e38), b'{"inputs": []}', b"\0" * (MAX_BODY_BYTES - 16),
    ]


def random_bodies(rng: random.Random, valid: bytes, count: int) -> list[bytes]:
    """Random bytes, half of them behind a valid packet head (dims, lengths and all then disagree)."""
    bodies = [rng.randbytes(rng.randrange(0, 4096)) for _ in range(count)]
    return [valid[:12] + body if i % 2 else body for i, body in enumerate(bodies)]


def mutated_packets(rng: random.Random, valid: bytes, count: int) -> list[bytes]:
    """A valid packet with a few bytes overwritten: codes may stay valid data, so a 200 is fair."""
    packets = []
    for _ in range(count):
        packet = bytearray(valid)
        for _ in range(rng.randrange(1, 8)):
            packet[rng.randrange(len(packet))] = rng.randrange(256)
        packets.append(bytes(packet))
    return packets


def assert_client_error(answer: httpx.Response, what: object) -> None:
    assert 400 <= answer.status_code < 500, (what, answer.status_code, answer.text[:300])
    assert isinstance(answer.json()["error"], str) and answer.json()["error"], (what, answer.text[:300])


def assert_served_or_refused(answer: httpx.Response, what: object) -> None:
    """Still a valid request (a 200 with its results) or a client error, never a 5xx."""
    if answer.status_code != 200:
        assert_client_error(answer, what)
    else:
        assert answer.json().get("results") or answer.json().get("outputs"), (what, answer.text[:300])


@pytest.fixture
def hostile(strict_server) -> Iterator[httpx.Client]:
    """A client of the strict server whose every wait is bounded: a hang fails the test."""
    with httpx.Client(base_url=strict_server.url, timeout=IO_TIMEOUT_S) as client:
        yield client


def tail_patterns(model_info: dict) -> list[dict]:
    """Per cut with a tail, one pattern taking a quantized activation and one taking floats."""
    kinds = {(p["cut"], p["activation_bits"] == 32): p for p in model_info["patterns"] if p["infer_url"]}
    return list(kinds.values())


def test_garbage_on_the_tail_infer_route_is_a_4xx(strict_server, hostile, tail, model_info):
    infer_url, valid = tail
    assert hostile.post(infer_url, content=valid).status_code == 200  # the garbage is garbage, not the route
    rng = random.Random(8)
    urls = [infer_url, *(p["infer_url"] for p in tail_patterns(model_info))]
    for body in nasty_packets(valid) + random_bodies(rng, valid, 60):
        url = rng.choice(urls)
        assert_client_error(hostile.post(url, content=body), (url, body[:40]))
    for body in mutated_packets(rng, valid, 40):
        assert_served_or_refused(hostile.post(infer_url, content=body), body[:40])
    assert_serves(strict_server, tail)


def oip_binary(header: object, blob: bytes) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body (JSON header, then the blob) and its honest header length."""
    head = json.dumps(header).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


def image_input(size: object = 3136, shape: list[int] | None = None, datatype: str = "FP32") -> dict:
    return {"inputs": [{"name": "input", "shape": shape or [1, 1, 28, 28], "datatype": datatype,
                        "parameters": {"binary_data_size": size}}]}


def test_garbage_on_the_oip_binary_infer_route_is_a_4xx(strict_server, hostile, tail):
    image = np.random.default_rng(8).random((1, 1, 28, 28), np.float32).tobytes()
    body, headers = oip_binary(image_input(), image)
    assert hostile.post(OIP, content=body, headers=headers).status_code == 200  # the valid one serves
    head_bytes = int(headers["Inference-Header-Content-Length"])
    cases: list[tuple[bytes, dict[str, str]]] = [
        # valid JSON, dishonest header lengths
        *((body, {"Inference-Header-Content-Length": v}) for v in (
            "", "-1", "0", "1", "abc", "1e3", "0x10", "1 2", "+12", b"\xb2\xb3", str(head_bytes - 1),
            str(head_bytes + 1), str(len(body) + 1), "9" * 30, "9" * 5000)),
        # truncated, overlong and mislabelled blobs
        oip_binary(image_input(), image[:100]), oip_binary(image_input(), b""),
        oip_binary(image_input(), image + b"\0"), oip_binary(image_input(), image * 2),
        *(oip_binary(image_input(size), image) for size in
          (-1, 0, 3135, 3137, "3136", 3136.0, True, None, 1e30, 10**40, [3136], {"n": 3136})),
        oip_binary(image_input(shape=[1, 1, 28, 29]), image),
        oip_binary(image_input(shape=[0, 1, 28, 28]), b""),
        oip_binary(image_input(shape=[2**31, 2**31, 2**31]), image),
        oip_binary(image_input(shape=[1, 1, 28, 28, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]), image),
        *(oip_binary(image_input(datatype=d), image) for d in ("FP64", "FP16", "UINT8", "BYTES", "INT4", "")),
        oip_binary({"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32",
                                "data": [0.5] * 784}]}, image),  # JSON data and a blob nobody claims
        oip_binary({"inputs": []}, image), oip_binary({"inputs": [{}]}, image), oip_binary([], image),
        oip_binary({**image_input(), "outputs": [{"name": "probabilities"}]}, image),
        oip_binary({"inputs": image_input()["inputs"] * 2}, image * 2),
        oip_binary(image_input(), np.full(784, np.nan, np.float32).tobytes()),
        # JSON that is not JSON
        *((raw + image, {"Inference-Header-Content-Length": str(len(raw))}) for raw in (
            b"{", b"null", b"[]", b'"inputs"', b"\xff\xfe\x00", b"[" * 5000, b'{"inputs":' * 2000,
            b'{"inputs": [{"name": "input", "shape": [1e400], "datatype": "FP32"}]}')),
    ]
    rng = random.Random(8)
    for _ in range(60):
        blob = rng.randbytes(rng.randrange(0, 4096))
        length = rng.choice([None, str(rng.randrange(0, len(blob) + 8))])
        cases.append((blob, {} if length is None else {"Inference-Header-Content-Length": length}))
    for content, case_headers in cases:
        assert_client_error(hostile.post(OIP, content=content, headers=case_headers),
                            (case_headers, content[:60]))
    assert_serves(strict_server, tail)


def test_garbage_on_the_oip_tail_model_is_a_4xx(strict_server, hostile, tail, model_info):
    infer_url, packet = tail
    pattern_id = infer_url.rsplit("/", 2)[-2]
    other = next(p["pattern_id"] for p in model_info["patterns"] if p["infer_url"] and p["cut"] != 0)

    def request(data: bytes, parameters: object = None, datatype: str = "UINT8",
                name: str = "activation_packet", size: object = None) -> tuple[bytes, dict[str, str]]:
        tensor = {"name": name, "shape": [len(data)], "datatype": datatype,
                  "parameters": {"binary_data_size": len(data) if size is None else size}}
        params = {"pattern_id": pattern_id} if parameters is None else parameters
        return oip_binary({"inputs": [tensor], "parameters": params}, data)

    body, headers = request(packet)
    answer = hostile.post("/v2/models/fmnist-cnn-tail/infer", content=body, headers=headers)
    assert answer.status_code == 200, answer.text  # the valid one serves
    rng = random.Random(8)
    cases = [
        request(packet, parameters={}), request(packet, parameters={"pattern_id": 5}),
        request(packet, parameters={"pattern_id": "c99-nope"}),
        request(packet, parameters={"pattern_id": other}), request(packet, parameters={"pattern_id": ""}),
        request(packet, datatype="INT8"), request(packet, datatype="FP32"), request(packet, name="input"),
        request(packet, size=len(packet) + 1),
        *(request(bad) for bad in nasty_packets(packet)[:-1] if bad),
        *(request(bad) for bad in random_bodies(rng, packet, 40) if bad),
        *(request(bad, parameters={"pattern_id": other}) for bad in mutated_packets(rng, packet, 10)),
        oip_binary({"inputs": [{"name": "activation_packet", "shape": [2], "datatype": "UINT8",
                                "data": [300, -1]}], "parameters": {"pattern_id": pattern_id}}, b""),
        oip_binary({"inputs": [{"name": "activation_packet", "shape": [1], "datatype": "UINT8",
                                "data": ["QPA"]}], "parameters": {"pattern_id": pattern_id}}, b""),
    ]
    for content, case_headers in cases:
        assert_client_error(hostile.post("/v2/models/fmnist-cnn-tail/infer", content=content,
                                         headers=case_headers), content[:80])
    for bad in mutated_packets(rng, packet, 20):
        content, case_headers = request(bad)
        assert_served_or_refused(hostile.post("/v2/models/fmnist-cnn-tail/infer", content=content,
                                              headers=case_headers), bad[:40])
    assert_serves(strict_server, tail)


def test_malformed_ranges_and_ids_on_the_segment_route_are_4xx(strict_server, hostile, tail, model_info):
    segment = largest_segment(model_info)
    data = hostile.get(segment["url"]).content
    size = len(data)
    assert size == segment["size_bytes"]
    # RFC 9110 14.2: what the server does not support (other units, several ranges) or cannot
    # parse is ignored, and the whole segment is sent; only a range past the end is a 416.
    for ignored in ("bytes=", "bytes=-", "bytes=5-2", "bytes=0-0,5-9", "items=0-5", "bytes=abc",
                    "bytes=1.5-2", "bytes=--1", "bytes=0x10-", "bytes=-" * 50, "bytes=0-1-2",
                    b"bytes=\xb2-\xb3", "=0-1", "bytes 0-1", "bytes=+1-2"):
        answer = hostile.get(segment["url"], headers={"Range": ignored})
        assert answer.status_code == 200 and answer.content == data, (ignored[:40], answer.status_code)
    for unsatisfiable in (f"bytes={size}-", "bytes=" + "9" * 5000 + "-", "bytes=-0", f"BYTES={size + 1}-"):
        answer = hostile.get(segment["url"], headers={"Range": unsatisfiable})
        assert answer.status_code == 416, (unsatisfiable[:40], answer.status_code, answer.text[:200])
        assert answer.json()["error"] and answer.headers["content-range"] == f"bytes */{size}"
        assert unsatisfiable[:20] not in answer.text  # the header is not echoed
    for case in ("Bytes=5-9", "BYTES=5-9", "bytes = 5-9"):  # the unit is case-insensitive
        answer = hostile.get(segment["url"], headers={"Range": case})
        assert answer.status_code == 206 and answer.content == data[5:10], (case, answer.status_code)
    # Huge but well-formed positions mean "to the end" (RFC 9110 14.1.2), not a crash.
    whole = (0, size - 1)
    for extreme, (start, end) in (("bytes=0-" + "9" * 5000, whole), ("bytes=-" + "9" * 5000, whole),
                                  ("bytes=" + "0" * 5000 + "5-9", (5, 9))):
        answer = hostile.get(segment["url"], headers={"Range": extreme})
        assert answer.status_code == 206, (extreme[:40], answer.text[:200])
        assert answer.content == data[start : end + 1]
    rng = random.Random(8)
    for _ in range(100):  # random ranges: a 206 with exactly the bytes it names, the whole, or a 416
        header = "bytes=" + "".join(rng.choice("0123456789-,") for _ in range(rng.randrange(0, 12)))
        answer = hostile.get(segment["url"], headers={"Range": header})
        assert answer.status_code in (200, 206, 416), (header, answer.status_code, answer.text[:200])
        if answer.status_code == 200:
            assert answer.content == data, header
        if answer.status_code == 206:
            first, last = map(int, answer.headers["content-range"].split()[1].split("/")[0].split("-"))
            assert answer.content == data[first : last + 1], header
    for bad_id in ("zz", "a" * 64, "A" * 64, "0" * 63, "0" * 65, "%00", "..%2f..%2fetc%2fpasswd"):
        assert_client_error(hostile.get(f"/v1/segments/{bad_id}"), bad_id)
    assert_serves(strict_server, tail)
