"""Hypothesis fuzzing of the binary routes: hostile bytes get a 4xx, never a 5xx."""

from __future__ import annotations

import json
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qpart.kernels.coding import zstd_compress

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def infer_urls(client):
    info = client.get("/v1/models/fmnist-cnn").json()
    return [p["infer_url"] for p in info["patterns"] if p["infer_url"]][:6]


@FUZZ
@given(data=st.data(), body=st.binary(max_size=3000))
def test_tail_infer_never_5xx(client, infer_urls, data, body):
    url = data.draw(st.sampled_from(infer_urls))
    if data.draw(st.booleans()):  # a plausible header with hostile fields behind it
        body = b"QPA\x01" + body
    headers = {}
    coding = data.draw(st.sampled_from([None, "deflate", "zstd", "deflate-garbage", "zstd-garbage"]))
    if coding == "deflate":  # the same hostile packet, validly deflated
        body, headers = zlib.compress(body), {"Content-Encoding": "deflate"}
    elif coding == "zstd":  # or validly zstd-compressed
        body, headers = zstd_compress(body), {"Content-Encoding": "zstd"}
    elif coding == "zstd-garbage":  # bytes that claim to be a zstd frame, some behind its magic number
        prefix = b"\x28\xb5\x2f\xfd" if data.draw(st.booleans()) else b""
        body, headers = prefix + body, {"Content-Encoding": "zstd"}
    elif coding is not None:  # bytes that claim to be deflated
        headers = {"Content-Encoding": "deflate"}
    response = client.post(url, content=body, headers=headers)
    assert 400 <= response.status_code < 500, response.text
    assert "error" in response.json()


def _binary_request(header: dict, blob: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


@FUZZ
@given(shape=st.lists(st.integers(0, 2**33), max_size=5),
       dtype=st.sampled_from(["FP32", "UINT8", "FP16", "INT64", "BYTES", "BOOL"]),
       size=st.one_of(st.integers(-5, 10**7), st.floats(allow_nan=True), st.text(max_size=3)),
       blob=st.binary(max_size=5000), name=st.sampled_from(["input", "activation_packet", "x"]),
       model=st.sampled_from(["fmnist-cnn", "fmnist-cnn-tail"]))
def test_v2_binary_infer_never_5xx(client, shape, dtype, size, blob, name, model):
    header = {"inputs": [{"name": name, "shape": shape, "datatype": dtype,
                          "parameters": {"binary_data_size": size}}]}
    try:
        body, headers = _binary_request(header, blob)
    except ValueError:  # NaN is not JSON
        return
    response = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    assert 400 <= response.status_code < 500, response.text


@FUZZ
@given(body=st.binary(max_size=2000), length=st.one_of(st.none(), st.text(max_size=6),
                                                       st.integers(-3, 3000).map(str)))
def test_v2_raw_garbage_never_5xx(client, body, length):
    headers = {} if length is None else {"Inference-Header-Content-Length": length}
    try:
        response = client.post("/v2/models/fmnist-cnn/infer", content=body, headers=headers)
    except UnicodeEncodeError:  # not a valid HTTP header value: nothing reaches the server
        return
    assert 400 <= response.status_code < 500, response.text


@pytest.mark.parametrize("binary", [True, False])
def test_an_empty_shape_whose_other_dimensions_overflow_is_a_400(client, binary):
    tensor = {"name": "input", "shape": [0, 14417, 689960, 231809337], "datatype": "FP32"}
    if binary:  # the case hypothesis found: a 500 from numpy's reshape
        body, headers = _binary_request({"inputs": [{**tensor, "parameters": {"binary_data_size": 0}}]}, b"")
        response = client.post("/v2/models/fmnist-cnn/infer", content=body, headers=headers)
    else:
        response = client.post("/v2/models/fmnist-cnn/infer", json={"inputs": [{**tensor, "data": []}]})
    assert response.status_code == 400 and "too large" in response.json()["error"]
