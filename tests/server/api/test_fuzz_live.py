"""Seeded, bounded fuzzing of the JSON and binary routes of /v1 and /v2 over real HTTP against a
live server: no answer is a 5xx or an overload, and after each route's run every route still
serves and readiness says so (the wedge check of :mod:`tests.server.api.test_robustness`)."""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qpart.kernels.coding import zstd_compress
from tests.conftest import LiveServer
from tests.server.api.test_robustness import PLAN, V2, assert_every_route_serves, cut0_tail, v2_body

pytestmark = pytest.mark.integration
CASES = 400  # per route: bounded, and the same cases every run (derandomized)
FUZZ = settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
counts: Counter[str] = Counter()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@pytest.fixture(scope="module")
def live(cnn_only) -> Iterator[LiveServer]:
    server = LiveServer(cnn_only, env={"QPART_MAX_QUEUE": "64", "QPART_HEADER_TIMEOUT_S": "5"})
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(live) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=15) as client:
        yield client


def check(route: str, answer: httpx.Response) -> None:
    """A 2xx/3xx, or a client error with the error body: never a 5xx, never a shed."""
    counts[route] += 1
    assert answer.status_code < 500, (route, answer.status_code, answer.text[:300])
    if answer.status_code >= 400:
        assert set(answer.json()) == {"error"} and answer.json()["error"], answer.text[:300]


def _json(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


@FUZZ
@given(field=st.sampled_from([*PLAN, "device", "weights", "deadline_s", "batch", "held_segments",
                              "upload_codings", "rtt_s", "upload_rate_bps", "extra"]),
       value=json_values | st.floats(allow_nan=True) | st.sampled_from([0, -1, 1e308, 2**63, "", []]),
       drop=st.booleans())
def test_plan_json(http, field, value, drop):
    body: dict[str, Any] = dict(PLAN)
    if drop and field in body:
        del body[field]
    else:
        body[field] = value
    check("POST /v1/plan", http.post("/v1/plan", content=_json(body),
                                     headers={"Content-Type": "application/json"}))


@FUZZ
@given(shape=st.lists(st.integers(-2, 2**33) | st.sampled_from([0, 1, 28]), max_size=5),
       datatype=st.sampled_from(["FP32", "FP16", "UINT8", "INT64", "BYTES", "BOOL", "fp32", ""]),
       data=st.lists(st.floats(allow_nan=True) | st.integers(-300, 300) | st.text(max_size=2), max_size=40),
       name=st.sampled_from(["input", "x", "activation_packet", ""]),
       model=st.sampled_from(["fmnist-cnn", "fmnist-cnn-tail", "nope"]), extra=json_values)
def test_v2_json(http, shape, datatype, data, name, model, extra):
    tensor = {"name": name, "shape": shape, "datatype": datatype, "data": data}
    body = {"inputs": [tensor], "parameters": extra if isinstance(extra, dict) else {"x": extra}}
    check("POST /v2/models/M/infer (JSON)", http.post(f"/v2/models/{model}/infer", content=_json(body)))


@FUZZ
@given(header=json_values, blob=st.binary(max_size=4000), split=st.integers(-10, 5000),
       shape=st.lists(st.integers(0, 40), min_size=4, max_size=4), size=st.integers(-1, 5000))
def test_v2_binary(http, header, blob, split, shape, size):
    if not isinstance(header, dict):  # half the time a plausible head with hostile numbers
        header = {"inputs": [{"name": "input", "shape": shape, "datatype": "FP32",
                              "parameters": {"binary_data_size": size}}]}
    head = _json(header)
    length = str(split if split >= 0 and split % 3 else len(head))
    check("POST /v2/models/M/infer (binary)", http.post(V2, content=head + blob,
                                                        headers={"Inference-Header-Content-Length": length}))


def mutate(packet: bytes, data: st.DataObject) -> bytes:
    """A valid activation packet with hostile edits: overwritten bytes, a field set to an extreme,
    truncated or extended, or random bytes behind its magic number."""
    kind = data.draw(st.sampled_from(["flip", "field", "truncate", "extend", "random"]))
    if kind == "flip":
        edits = data.draw(st.lists(st.tuples(st.integers(0, len(packet) - 1), st.integers(0, 255)),
                                   min_size=1, max_size=6))
        out = bytearray(packet)
        for pos, byte in edits:
            out[pos] = byte
        return bytes(out)
    if kind == "field":  # bits, ndim, group size or a dim (the header is 12 bytes, then dims)
        offset, width = data.draw(st.sampled_from([(4, 1), (5, 1), (8, 4), (12, 4), (16, 4)]))
        value = data.draw(st.sampled_from([0, 1, 2**(8 * width) - 1, 2**(8 * width - 1)]))
        return packet[:offset] + value.to_bytes(width, "little") + packet[offset + width:]
    if kind == "truncate":
        return packet[: data.draw(st.integers(0, len(packet) - 1))]
    if kind == "extend":
        return packet + data.draw(st.binary(min_size=1, max_size=64))
    return packet[:4] + data.draw(st.binary(max_size=2000))


@pytest.fixture(scope="module")
def tail(live) -> tuple[str, bytes]:
    return cut0_tail(live.url)


@FUZZ
@given(data=st.data(), coding=st.sampled_from([None, "deflate", "zstd", "deflate-garbage", "gzip"]))
def test_tail_binary(http, tail, data, coding):
    infer_url, packet = tail
    body, headers = mutate(packet, data), {}
    if coding == "deflate":
        body, headers = zlib.compress(body), {"Content-Encoding": "deflate"}
    elif coding == "zstd":
        body, headers = zstd_compress(body), {"Content-Encoding": "zstd"}
    elif coding is not None:
        headers = {"Content-Encoding": coding.removesuffix("-garbage")}
    top_k = data.draw(st.sampled_from(["", "?top_k=1", "?top_k=0", "?top_k=99999", "?top_k=x"]))
    check("POST /v1/models/M/versions/V/patterns/P/infer", http.post(infer_url + top_k, content=body,
                                                                    headers=headers))


@pytest.fixture(scope="module")
def segment_url(http) -> str:
    info = http.get("/v1/models/fmnist-cnn").json()
    return str(next(p["segment"]["url"] for p in info["patterns"] if p["segment"]))


@FUZZ
@given(unit=st.sampled_from(["bytes", "Bytes", "items", ""]), first=st.text("0123456789", max_size=25),
       last=st.text("0123456789", max_size=25), more=st.text("0123456789-, ", max_size=12),
       inm=st.sampled_from([None, "*", '"x"', "W/", ""]))
def test_segment_ranges(http, segment_url, unit, first, last, more, inm):
    headers = {"Range": f"{unit}={first}-{last}{more}".strip()}
    if inm is not None:
        headers["If-None-Match"] = inm
    answer = http.get(segment_url, headers=headers)
    check("GET /v1/segments/S", answer)
    assert answer.status_code in (200, 206, 304, 416), (headers, answer.status_code)


@pytest.mark.parametrize("route", ["plan", "v2-json", "v2-binary", "tail", "segments"])
def test_after_the_fuzz_every_route_serves(live, route):
    assert_every_route_serves(live)
    assert httpx.post(f"{live.url}{V2}", json=v2_body(3), timeout=15).status_code == 200


def test_fuzz_case_counts(capsys):
    """The cases sent per route (run with ``-s`` to see them); each route ran its whole budget."""
    if len(counts) < 5:
        pytest.skip("counted only when the whole module runs")
    with capsys.disabled():
        print("\nfuzz cases per route:", json.dumps(dict(counts), indent=1))
    assert all(n >= CASES for n in counts.values()), counts
