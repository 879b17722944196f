"""Bad ONNX segments over real HTTP (issue 25): each kind is refused by
``OnnxDeviceRuntime.fetch_segment`` with a one-line error, and nothing of it stays in the cache.

The segments are served by a ``ThreadingHTTPServer`` on a loopback socket, with plans that point
at it; the transport is the device's own, unmocked."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qpart.client.errors import SegmentError, SegmentRefusedError
from qpart.client.onnx_runtime import OnnxDeviceRuntime
from qpart.client.plans import PlanResponse
from qpart.client.settings import DeviceSettings
from qpart.kernels.onnx_segment import (
    INPUT_NAME,
    ONNX_OPSET,
    ONNX_SEGMENT_FORMAT,
    ONNX_SEGMENT_FORMAT_VERSION,
    OUTPUT_NAME,
    OnnxSegmentLimits,
)
from tests.client.samples import PLAN

pytestmark = pytest.mark.integration
GATE_S = 3.0


@dataclass
class Served:
    """What the server answers for the segment URL, and what it did."""

    body: bytes = b""
    content_length: bool = True
    gate: threading.Event | None = None
    """Set: the headers go out at once, the body only once the gate opens (or after GATE_S)."""
    requests: list[str] = field(default_factory=list)
    body_bytes_sent: int = 0


class _Handler(BaseHTTPRequestHandler):
    served: Served

    def do_GET(self) -> None:
        served = self.served
        served.requests.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if served.content_length:
            self.send_header("Content-Length", str(len(served.body)))
        self.end_headers()
        self.wfile.flush()
        if served.gate is not None:
            served.gate.wait(GATE_S)
        try:
            self.wfile.write(served.body)
            self.wfile.flush()
            served.body_bytes_sent += len(served.body)
        except OSError:
            pass  # the device hung up: what it refused is not sent

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served() -> Iterator[tuple[Served, str]]:
    """A live loopback HTTP server and its base URL; every GET answers with ``Served``."""
    state = Served()
    handler = type("Handler", (_Handler,), {"served": state})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        if state.gate is not None:
            state.gate.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def _segment(nodes: list[onnx.NodeProto] | None = None, initializers: list[onnx.TensorProto] | None = None,
             opsets: tuple[tuple[str, int], ...] = (("", ONNX_OPSET),)) -> bytes:
    """An ONNX segment for the plan below: ``input`` + w -> ``activation`` unless told otherwise."""
    nodes = nodes if nodes is not None else [helper.make_node("Add", [INPUT_NAME, "w"], [OUTPUT_NAME])]
    initializers = initializers if initializers is not None else [
        numpy_helper.from_array(np.ones(4, np.float32), "w")]
    graph = helper.make_graph(
        nodes, "head", [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets],
                              ir_version=8, producer_name=ONNX_SEGMENT_FORMAT,
                              producer_version=ONNX_SEGMENT_FORMAT_VERSION)
    helper.set_model_props(model, {"model": PLAN["model"], "version": PLAN["version"], "cut": "1",
                                   "pattern_id": "c1-x"})
    return model.SerializeToString()


def _external() -> bytes:
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="/etc/passwd")
    return _segment(initializers=[tensor])


def _plan(segment_id: str, size_bytes: int) -> PlanResponse:
    segment = {"id": segment_id, "url": f"/v1/segments/{segment_id}", "size_bytes": size_bytes,
               "sha256": segment_id, "held": False, "runtime": "onnx"}
    plan_id = f"{PLAN['model']}@{PLAN['version']}/c1-x"  # the pattern the segment's metadata names
    return PlanResponse.model_validate({**PLAN, "plan_id": plan_id, "cut": 1, "segment": segment})


@dataclass(frozen=True)
class Bad:
    """A bad segment: the bytes the plan names, what the server sends instead, the device's cap."""

    good: bytes
    sent: bytes | None = None
    content_length: bool = True
    max_bytes: int | None = None


GOOD = _segment()
BAD = {
    "truncated": (Bad(GOOD, GOOD[:-10]), SegmentError, r"truncated: \d+ of \d+ bytes"),
    "digest mismatch": (Bad(GOOD, GOOD[:-1] + bytes([GOOD[-1] ^ 1])), SegmentError,
                        "does not match its sha256"),
    "external data": (Bad(_external()), SegmentRefusedError, "refers to external data"),
    "custom node domain": (Bad(_segment(
        nodes=[helper.make_node("Add", [INPUT_NAME, "w"], [OUTPUT_NAME], domain="com.example")],
        opsets=(("", ONNX_OPSET), ("com.example", 1)))), SegmentRefusedError, "custom operator domain"),
    "custom node domain only": (Bad(_segment(
        nodes=[helper.make_node("Add", [INPUT_NAME, "w"], [OUTPUT_NAME], domain="com.example")])),
        SegmentRefusedError, "of the custom domain 'com.example'"),
    "custom opset import": (Bad(_segment(opsets=(("", ONNX_OPSET), ("com.microsoft", 1)))),
                            SegmentRefusedError, "custom operator domain 'com.microsoft'"),
    "operator outside the allow-list": (Bad(_segment(
        nodes=[helper.make_node("RandomNormalLike", [INPUT_NAME], [OUTPUT_NAME])], initializers=[])),
        SegmentRefusedError, "'RandomNormalLike', which is not in the allow-list"),
    "announced over the cap": (Bad(GOOD, max_bytes=len(GOOD) - 1), SegmentRefusedError,
                               rf"announces {len(GOOD)} bytes, over this device's cap of {len(GOOD) - 1}"),
    "more than announced, by Content-Length": (Bad(GOOD, GOOD + bytes(1 << 20)), SegmentRefusedError,
                                               rf"Content-Length .* more than the {len(GOOD)} bytes"),
    "more than announced, while streaming": (Bad(GOOD, GOOD + bytes(1 << 20), content_length=False),
                                             SegmentRefusedError, rf"sent at least .* more than the "
                                             rf"{len(GOOD)} bytes"),
}


def _runtime(url: str, cache: Path, max_bytes: int | None = None) -> OnnxDeviceRuntime:
    limits = OnnxSegmentLimits() if max_bytes is None else OnnxSegmentLimits(max_bytes=max_bytes)
    settings = DeviceSettings(server=url, cache_dir=cache, retries=1, backoff_s=0.01, timeout_s=10)
    return OnnxDeviceRuntime(settings, limits=limits)


def _left_in(cache: Path) -> list[str]:
    return sorted(p.name for p in (*cache.glob("*.seg"), *cache.glob("*.part")))


def test_a_good_segment_is_fetched_and_cached(served, tmp_path):
    state, url = served
    state.body = GOOD
    digest = hashlib.sha256(GOOD).hexdigest()
    runtime = _runtime(url, tmp_path / "cache")
    try:
        data, downloaded = runtime.fetch_segment(_plan(digest, len(GOOD)))
    finally:
        runtime.close()
    assert data == GOOD and downloaded == len(GOOD)
    assert _left_in(tmp_path / "cache") == [f"{digest}.seg"]


@pytest.mark.parametrize("kind", list(BAD))
def test_a_bad_segment_is_refused_in_one_line_and_nothing_is_cached(served, tmp_path, kind):
    bad, error, what = BAD[kind]
    state, url = served
    state.body = bad.good if bad.sent is None else bad.sent
    state.content_length = bad.content_length
    digest = hashlib.sha256(bad.good).hexdigest()
    runtime = _runtime(url, tmp_path / "cache", bad.max_bytes)
    try:
        with pytest.raises(error, match=what) as info:
            runtime.fetch_segment(_plan(digest, len(bad.good)))
    finally:
        runtime.close()
    assert "\n" not in str(info.value)
    assert _left_in(tmp_path / "cache") == []


def test_a_segment_announced_over_the_cap_is_never_requested(served, tmp_path):
    state, url = served
    state.body = GOOD
    digest = hashlib.sha256(GOOD).hexdigest()
    runtime = _runtime(url, tmp_path / "cache", max_bytes=len(GOOD) - 1)
    try:
        with pytest.raises(SegmentRefusedError, match="nothing was downloaded"):
            runtime.fetch_segment(_plan(digest, len(GOOD)))
    finally:
        runtime.close()
    assert state.requests == [] and state.body_bytes_sent == 0
    assert _left_in(tmp_path / "cache") == []


def test_a_content_length_over_the_announced_size_is_refused_before_the_body_is_sent(served, tmp_path):
    # The server sends its headers, then holds the body back until the gate opens: a device that
    # read any of the body would wait for it, so a refusal with nothing sent was made on the headers.
    state, url = served
    state.body = GOOD + bytes(1 << 20)
    state.gate = threading.Event()
    digest = hashlib.sha256(GOOD).hexdigest()
    runtime = _runtime(url, tmp_path / "cache")
    try:
        with pytest.raises(SegmentRefusedError, match="Content-Length"):
            runtime.fetch_segment(_plan(digest, len(GOOD)))
        assert state.body_bytes_sent == 0 and len(state.requests) == 1
    finally:
        state.gate.set()
        runtime.close()
    assert _left_in(tmp_path / "cache") == []


def _fetch_then_load(url: str, cache: Path, segment: bytes) -> tuple[OnnxDeviceRuntime, PlanResponse, bytes]:
    runtime = _runtime(url, cache)
    plan = _plan(hashlib.sha256(segment).hexdigest(), len(segment))
    data, _ = runtime.fetch_segment(plan)
    assert data is not None and _left_in(cache) == [f"{plan.segment.id}.seg"]  # passed the check
    return runtime, plan, data


# Both pass the check (it tracks shapes, not element types or the model's input): int64 added to
# float32, which ONNX Runtime will not load; and a graph that takes [N, 4] where the plan's model
# sends [N, 1, 28, 28], which fails at run time.
ORT_REFUSES = {
    "at load": (_segment(initializers=[numpy_helper.from_array(np.ones(4, np.int64), "w")]),
                r"cannot load the segment.*cached copy was deleted"),
    "at run time": (GOOD, r"could not run segment .* shape \[1, 1, 28, 28\]"),
}


@pytest.mark.parametrize("when", list(ORT_REFUSES))
def test_a_segment_onnx_runtime_refuses_is_refused_in_one_line_and_uncached(served, tmp_path, when):
    segment, what = ORT_REFUSES[when]
    state, url = served
    state.body = segment
    runtime, plan, data = _fetch_then_load(url, tmp_path / "cache", segment)
    try:
        with pytest.raises(SegmentError, match=what) as info:
            runtime.load_head(plan, data)(np.zeros((1, 1, 28, 28), np.float32))
    finally:
        runtime.close()
    assert "\n" not in str(info.value)
    assert _left_in(tmp_path / "cache") == []
