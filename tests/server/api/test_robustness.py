"""The robustness suite: no single request or client takes a live server down. After each hostile
request, a well-formed request of every route succeeds and readiness tells the truth."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from qpart.client.plans import PacketFormat
from qpart.client.runtime import encode_for_plan
from qpart.server.api.connections import PROBE_RESERVE
from tests.conftest import REPO, LiveServer
from tests.server.api.test_faults import IO_TIMEOUT_S, RawResponse, parse_response, request_head

pytestmark = pytest.mark.integration
HEADER_TIMEOUT_S = 1.0
MAX_QUEUE = 8
V2 = "/v2/models/fmnist-cnn/infer"
PLAN = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6}


@pytest.fixture(scope="module")
def hardened(cnn_only: Path) -> Iterator[LiveServer]:
    """A server with a short head timeout and a small queue, so each limit is quick to reach."""
    live = LiveServer(cnn_only, env={"QPART_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
                                     "QPART_MAX_QUEUE": str(MAX_QUEUE)})
    live.wait_ready()
    yield live
    live.stop()


def cut0_tail(url: str) -> tuple[str, bytes]:
    """The cut-0 pattern at the 1% level (the plan devices get most often) and a packet for it."""
    info = httpx.get(f"{url}/v1/models/fmnist-cnn", timeout=IO_TIMEOUT_S).json()
    pattern = next(p for p in info["patterns"] if p["cut"] == 0 and p["level"] == 0.01)
    image = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
    return pattern["infer_url"], encode_for_plan(image, PacketFormat.model_validate(pattern))


def v2_body(batch: int) -> dict[str, object]:
    return {"inputs": [{"name": "input", "shape": [batch, 1, 28, 28], "datatype": "FP32",
                        "data": [0.5] * (batch * 784)}]}


def assert_every_route_serves(server: LiveServer) -> None:
    """The wedge check: a /v2 infer, a cut-0 tail infer, a plan and a segment download succeed,
    and readiness says 200; a hang fails on the client's timeout instead of blocking the suite."""
    with httpx.Client(base_url=server.url, timeout=IO_TIMEOUT_S) as c:
        assert c.post(V2, json=v2_body(1)).status_code == 200
        infer_url, packet = cut0_tail(server.url)
        tail = c.post(infer_url, content=packet)
        assert tail.status_code == 200, tail.text
        plan = c.post("/v1/plan", json={**PLAN, "rate_bps": 1e4, "device": "jetson-nano"})
        assert plan.status_code == 200, plan.text
        info = c.get("/v1/models/fmnist-cnn").json()
        segment = next(p["segment"] for p in info["patterns"] if p["segment"])
        download = c.get(segment["url"])
        assert download.status_code == 200 and len(download.content) == segment["size_bytes"]
        assert c.get("/v2/health/ready").status_code == 200
        assert c.get("/v2/models/fmnist-cnn/ready").status_code == 200


def raw_exchange(server: LiveServer, data: bytes, timeout_s: float = IO_TIMEOUT_S) -> RawResponse | None:
    """Send ``data`` and read until the server closes; None when it closed without an answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    answer = b"".join(chunks)
    return parse_response(answer) if answer else None


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# ---- 1: a batch of nothing wedged the model --------------------------------------------------


def test_an_empty_batch_is_a_400_naming_the_input_and_the_model_keeps_serving(hardened):
    body = {"inputs": [{"name": "input", "shape": [0, 1, 28, 28], "datatype": "FP32", "data": []}]}
    for _ in range(3):  # the first one killed the collector; later ones then hung for 30 s
        answer = httpx.post(f"{hardened.url}{V2}", json=body, timeout=IO_TIMEOUT_S)
        assert answer.status_code == 400 and "batch 0" in answer.json()["error"], answer.text
    assert_every_route_serves(hardened)


def test_an_empty_activation_batch_on_the_tail_route_is_a_400(hardened):
    infer_url, packet = cut0_tail(hardened.url)
    empty = packet[:12] + (0).to_bytes(4, "little") + packet[16:]  # dims[0], the batch, set to 0
    answer = httpx.post(f"{hardened.url}{infer_url}", content=empty, timeout=IO_TIMEOUT_S)
    assert answer.status_code == 400 and answer.json()["error"], answer.text
    assert_every_route_serves(hardened)


# ---- 2, 3: heads without bounds, connections without timeouts ---------------------------------


def test_an_oversize_header_is_refused_at_once_without_the_server_growing(hardened):
    before = rss_bytes(hardened.proc.pid)
    head = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 << 20) + b"\r\n\r\n"
    answer = raw_exchange(hardened, head)
    assert answer is None or answer.status == 431, answer  # 431, or closed before it could be read
    grown = rss_bytes(hardened.proc.pid) - before
    assert grown < 16 << 20, f"RSS grew {grown / 2**20:.1f} MiB on a refused 100 MiB header"
    many = b"GET /v2/health/ready HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(20000))
    answer = raw_exchange(hardened, many + b"\r\n")
    assert answer is None or answer.status == 431, answer
    assert_every_route_serves(hardened)


def test_a_head_within_the_limit_is_served_even_split_over_many_reads(hardened):
    head = request_head("GET", "/v2/health/ready", {"X-Pad": "p" * 30000, "Connection": "close"})
    with socket.create_connection(("127.0.0.1", hardened.port), timeout=IO_TIMEOUT_S) as sock:
        for i in range(0, len(head), 997):
            sock.sendall(head[i : i + 997])
        answer = parse_response(sock.recv(65536))
    assert answer.status == 200, answer


@pytest.mark.parametrize("trickled", [b"", b"GET /v2/health/ready HTTP/1.1\r\nX-Slow: "],
                         ids=["silent", "trickling"])
def test_a_silent_or_trickling_connection_is_closed_after_the_head_timeout(hardened, trickled):
    with socket.create_connection(("127.0.0.1", hardened.port), timeout=IO_TIMEOUT_S) as sock:
        opened = time.monotonic()
        sock.sendall(trickled)
        closed_at, data = None, b""
        sock.settimeout(0.1)
        while time.monotonic() - opened < IO_TIMEOUT_S:
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                if trickled:
                    sock.sendall(b"a")  # a byte every 0.1 s: never a complete head
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                closed_at = time.monotonic() - opened
                break
            data += chunk
    assert closed_at is not None, "the server never closed the connection"
    assert closed_at >= HEADER_TIMEOUT_S * 0.9
    assert parse_response(data).status == 408, data[:200]
    assert_every_route_serves(hardened)


def _one_answer(port: int, path: str) -> bytes:
    """What a new connection asking ``path`` gets before the server closes it (b"": nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S) as sock:
        sock.sendall(request_head("GET", path))
        data = b""
        try:
            while chunk := sock.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
        return data


def test_past_the_connection_cap_probes_are_answered_and_everything_else_refused(cnn_only):
    cap = 24
    server = LiveServer(cnn_only, env={"QPART_MAX_CONNECTIONS": str(cap), "QPART_HEADER_TIMEOUT_S": "30"})
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=IO_TIMEOUT_S) as established:
            assert established.get("/v2/health/ready").status_code == 200  # its connection stays open
            idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(cap - 1)]
            try:
                time.sleep(0.3)  # the server has accepted them all: it is at the cap
                probe = _one_answer(server.port, "/v2/health/ready")  # a kubelet probe: answered, closed
                assert parse_response(probe).status == 200, probe[:200]
                other = _one_answer(server.port, "/v1/models/fmnist-cnn")
                assert parse_response(other).status == 503, other[:200]
                reserve = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(PROBE_RESERVE)]
                try:
                    time.sleep(0.3)  # past the cap and its probe reserve: closed at once
                    assert _one_answer(server.port, "/v2/health/ready") == b""
                finally:
                    for sock in reserve:
                        sock.close()
                assert established.get("/v2/health/ready").status_code == 200
                assert established.post(V2, json=v2_body(1)).status_code == 200
            finally:
                for sock in idle:
                    sock.close()
        refused_total = [line for line in httpx.get(f"{server.url}/metrics").text.splitlines()
                         if line.startswith('qpart_connections_refused_total{reason="over_cap"}')]
        assert refused_total and float(refused_total[0].split()[-1]) >= 2, refused_total
    finally:
        server.stop()


def test_chunk_trailers_are_bounded_like_a_head(hardened):
    before = rss_bytes(hardened.proc.pid)
    head = (b"POST /v1/plan HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Big: ")
    answer = raw_exchange(hardened, head + b"a" * (48 << 20))
    assert answer is None or answer.status == 431, answer
    grown = rss_bytes(hardened.proc.pid) - before
    assert grown < 16 << 20, f"RSS grew {grown / 2**20:.1f} MiB on a refused 48 MiB trailer"
    assert_every_route_serves(hardened)


# ---- 4: a request that can never succeed is not overload --------------------------------------


def test_a_batch_larger_than_the_queue_is_a_413_naming_the_limit_not_a_503(hardened):
    answer = httpx.post(f"{hardened.url}{V2}", json=v2_body(MAX_QUEUE + 1), timeout=IO_TIMEOUT_S)
    assert answer.status_code == 413 and "QPART_MAX_QUEUE" in answer.json()["error"], answer.text
    assert "retry-after" not in answer.headers
    assert_every_route_serves(hardened)


# ---- 5: empty credentials ---------------------------------------------------------------------


@pytest.mark.parametrize("variable", ["QPART_AUTH_TOKEN", "QPART_ADMIN_TOKEN"])
def test_serve_refuses_to_start_with_an_empty_token(cnn_only, variable):
    server = LiveServer(cnn_only, env={variable: " "})
    try:
        assert server.proc.wait(60) != 0
    finally:
        output = server.stop()
    assert "empty or whitespace-only token" in output, output[-2000:]


def test_a_bare_bearer_scheme_is_no_credential(cnn_only):
    server = LiveServer(cnn_only, env={"QPART_AUTH_TOKEN": "s3cret", "QPART_ADMIN_TOKEN": "adm"})
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=IO_TIMEOUT_S) as c:
            for value in ("Bearer", "bearer"):  # httpx sends no trailing blanks; test_api covers them
                assert c.post("/v1/plan", json=PLAN, headers={"Authorization": value}).status_code == 401
                admin = c.put("/v1/admin/segment-cache", json={"budget_bytes": 0},
                              headers={"Authorization": value})
                assert admin.status_code == 401
            assert c.get("/v1/models/fmnist-cnn").status_code == 401  # the weights stay private
    finally:
        server.stop()


# ---- 6: the smaller ones ----------------------------------------------------------------------


@pytest.mark.parametrize("head_s", ["Infinity", "1e308", "NaN"])
def test_a_plan_with_huge_or_infinite_profile_times_is_a_4xx_never_a_null(hardened, head_s):
    device = json.loads((REPO / "profiles/devices/jetson-nano.json").read_text())
    version = httpx.get(f"{hardened.url}/v1/models/fmnist-cnn", timeout=IO_TIMEOUT_S).json()["version"]
    device["measured"] = {"fmnist-cnn": {"version": version, "head_s": [0.001] * 8 + [head_s],
                                         "warmup": 1, "repeats": 1}}
    body = json.dumps({**PLAN, "device": device}).replace(f'"{head_s}"', head_s)
    answer = httpx.post(f"{hardened.url}/v1/plan", content=body, timeout=IO_TIMEOUT_S,
                        headers={"Content-Type": "application/json"})
    assert 400 <= answer.status_code < 500 and "head_s" in answer.json()["error"], answer.text
    assert_every_route_serves(hardened)


@pytest.mark.parametrize("coded", [b"plain", b"gzip"])
def test_a_plan_with_a_content_encoding_is_a_415(hardened, coded):
    import gzip

    body = json.dumps(PLAN).encode()
    content = gzip.compress(body) if coded == b"gzip" else body
    answer = httpx.post(f"{hardened.url}/v1/plan", content=content, timeout=IO_TIMEOUT_S,
                        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert answer.status_code == 415, answer.text
    assert_every_route_serves(hardened)


def test_an_injected_tail_failure_fails_only_its_batch(cnn_only, monkeypatch):
    """In process (the seam is the engine's runner): the failing request gets a JSON 500, the
    next one on the same model and cut is served, and readiness stays 200."""
    from qpart.server.tails.tail_pool import TailPool
    from tests.server.conftest import make_client

    original = TailPool.runner
    failures = []

    def failing_once(self, model, cut):
        run = original(self, model, cut)

        def maybe_fail(batch):
            if not failures:
                failures.append(batch.shape[0])
                raise RuntimeError("injected tail failure")
            return run(batch)

        return maybe_fail

    with make_client(cnn_only) as c:
        monkeypatch.setattr(TailPool, "runner", failing_once)
        c.app.state.engine.tails._runs.clear()  # built again through the failing runner
        failed = c.post(V2, json=v2_body(1))
        assert failed.status_code == 500 and set(failed.json()) == {"error"}, failed.text
        assert "other requests are unaffected" in failed.json()["error"]
        assert c.post(V2, json=v2_body(2)).status_code == 200
        assert c.get("/v2/health/ready").status_code == 200
    assert failures == [1]
