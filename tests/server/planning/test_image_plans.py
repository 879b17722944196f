"""The input-image plan (ADR 0014) over HTTP: planned only when offered, priced as the planner
prices every plan, and served from a PNG exactly as the card's preprocessing and the float model
answer; every wrong body or type a 4xx naming why, on the router and the fast path alike."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from qpart.models.preprocess import preprocess_image
from qpart.models.registry import get_model
from tests.server.conftest import make_client

MODEL = "fmnist-cnn"


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


SHIRT = np.zeros((28, 28), np.uint8)
SHIRT[4:24, 6:22] = 180
NOISE = np.random.default_rng(3).integers(0, 256, (28, 28), dtype=np.uint8)


@pytest.fixture(scope="module", params=[True, False], ids=["fast-path", "router"])
def any_client(request, cnn_only) -> Iterator[TestClient]:
    with make_client(cnn_only, inference_fast_path=request.param) as c:
        yield c


def _plan(client: TestClient, png: bytes | None, **extra: object) -> dict:
    body: dict[str, object] = {"model": MODEL, "accuracy_demand": 0.01, "rate_bps": 1e6,
                               "device": "raspberry-pi-4", **extra}
    if png is not None:
        body["input_image"] = {"png_bytes": len(png), "width": 28, "height": 28, "encode_s": 1e-4}
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_small_image_is_planned_as_itself_and_a_large_one_is_not(client):
    small = _plan(client, _png(SHIRT))  # about 100 B: less than any packet of the input
    assert small["plan_id"].endswith("/input-png") and small["upload_content_type"] == "image/png"
    assert (small["cut"], small["level"], small["segment"]) == (0, 0.0, None)
    assert small["infer_url"].endswith("/patterns/input-png/infer")
    without = _plan(client, None)
    assert without["upload_content_type"] == "application/octet-stream"
    assert small["predicted"]["objective"] < without["predicted"]["objective"]
    # the same image at 20 kB would cost more than the plan without it: not chosen
    heavy = _plan(client, b"x" * 20_000)
    assert heavy["plan_id"] == without["plan_id"]


def test_the_plan_names_its_cheapest_image_plan_where_an_image_was_offered(client):
    small = _plan(client, _png(SHIRT))
    assert small["input_image_plan"] == small["predicted"]  # the image plan was chosen
    heavy = _plan(client, b"x" * 20_000)  # not chosen: priced, and dearer than the plan chosen
    image = heavy["input_image_plan"]
    assert image["transfer_bytes"] > 20_000 and image["time_s"]["local"] == pytest.approx(1e-4)
    assert image["objective"] > heavy["predicted"]["objective"]
    assert _plan(client, None)["input_image_plan"] is None  # nothing offered


def test_the_image_plan_is_priced_with_the_requests_figures(client):
    png = _png(SHIRT)
    info = client.get(f"/v1/models/{MODEL}").json()
    for encode_s, extra_bytes in [(1e-4, 0), (0.002, 0), (1e-4, 300)]:
        body = {"model": MODEL, "accuracy_demand": 0.01, "rate_bps": 1e6, "device": "raspberry-pi-4",
                "deadline_s": 10.0, "input_image": {"png_bytes": len(png) + extra_bytes, "width": 28,
                                                    "height": 28, "encode_s": encode_s}}
        plan = client.post("/v1/plan", json=body).json()  # the most accurate plan that meets 10 s: level 0
        assert plan["plan_id"].endswith("/input-png"), plan["plan_id"]
        p = plan["predicted"]
        # the PNG's bytes, the answer's and one exchange's headers (planner.HTTP_EXCHANGE_BYTES)
        assert p["transfer_bytes"] == len(png) + extra_bytes + info["answer_bytes"] + 768
        assert p["time_s"]["local"] == pytest.approx(encode_s)  # no head and no quantization
        tail = info["server_tail_s"][0]
        assert tail < p["time_s"]["server"] < tail + 0.01  # the tail of cut 0 and the decoding


@pytest.mark.parametrize("extra", [{"batch": 2}, {"input_image": {"png_bytes": 100, "width": 5000,
                                                                  "height": 5000}}])
def test_no_image_plan_for_a_batch_or_an_image_over_the_bound(client, extra):
    body = {"model": MODEL, "accuracy_demand": 0.01, "rate_bps": 1e6, "device": "raspberry-pi-4",
            "input_image": {"png_bytes": 100, "width": 28, "height": 28}} | extra
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200 and not r.json()["plan_id"].endswith("/input-png")


@pytest.mark.parametrize("image", [{"png_bytes": 0, "width": 28, "height": 28},
                                   {"png_bytes": 10, "width": 0, "height": 28},
                                   {"png_bytes": 10, "width": 28, "height": 28, "encode_s": -1},
                                   {"png_bytes": 10, "width": 28},
                                   {"png_bytes": 10, "width": 28, "height": 28, "extra": 1}])
def test_a_malformed_image_offer_is_a_422(client, image):
    body = {"model": MODEL, "accuracy_demand": 0.01, "rate_bps": 1e6, "input_image": image}
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 422 and "error" in r.json()


@pytest.mark.parametrize("pixels", [SHIRT, NOISE], ids=["shirt", "noise"])
def test_the_answer_is_the_float_models_on_the_cards_preprocessing(any_client, pixels):
    url = _image_url(any_client)  # noise is 800 B, more than a packet: posted to the plan's URL anyway
    r = any_client.post(url, content=_png(pixels), headers={"Content-Type": "image/png"})
    assert r.status_code == 200, r.text
    x = preprocess_image(Image.fromarray(pixels), get_model(MODEL).preprocess)[None]
    v2 = any_client.post(f"/v2/models/{MODEL}/infer", json={"inputs": [
        {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]})
    assert v2.status_code == 200, v2.text
    assert r.json()["results"][0]["logits"] == v2.json()["outputs"][0]["data"]
    assert url.endswith(r.json()["plan_id"].split("/", 1)[1] + "/infer") and r.json()["compute_s"] > 0
    timing = r.headers["server-timing"]  # the decoding's share of compute_s, in milliseconds
    assert timing.startswith("decode;dur=") and 0 < float(timing[11:]) / 1e3 <= r.json()["compute_s"]


def _image_url(client: TestClient) -> str:
    return _plan(client, _png(SHIRT))["infer_url"]


@pytest.mark.parametrize(("headers", "status", "words"), [
    ({}, 415, "takes the image as 'image/png'"),
    ({"Content-Type": "application/octet-stream"}, 415, "not 'application/octet-stream'"),
    ({"Content-Type": "image/png", "Content-Encoding": "zstd"}, 415, "PNG as is"),
    ({"Content-Type": "image/png", "Content-Encoding": "identity"}, 200, ""),
    ({"Content-Type": "image/png; charset=x"}, 200, ""),
])
def test_the_image_route_names_a_wrong_type(any_client, headers, status, words):
    r = any_client.post(_image_url(any_client), content=_png(SHIRT), headers=headers)
    assert r.status_code == status, r.text
    assert words in r.text


def test_an_image_to_a_packet_pattern_is_a_415(any_client):
    info = any_client.get(f"/v1/models/{MODEL}").json()
    url = next(p["infer_url"] for p in info["patterns"] if p["infer_url"])
    r = any_client.post(url, content=_png(SHIRT), headers={"Content-Type": "image/png"})
    assert r.status_code == 415 and "input-png" in r.json()["error"]


@pytest.mark.parametrize(("body", "words"), [
    (b"", "empty"), (b"GIF89a" + b"\0" * 30, "not a PNG"),
    (_png(np.zeros((28, 28, 3), np.uint8))[:60], "does not decode"),
])
def test_a_bad_image_is_a_400_naming_why(any_client, body, words):
    r = any_client.post(_image_url(any_client), content=body, headers={"Content-Type": "image/png"})
    assert r.status_code == 400 and words in r.json()["error"], r.text


def test_an_image_plan_of_an_unknown_version_is_a_404(client):
    r = client.post(f"/v1/models/{MODEL}/versions/000000000000/patterns/input-png/infer", content=_png(SHIRT),
                    headers={"Content-Type": "image/png"})
    assert r.status_code == 404


@pytest.mark.parametrize("headers", [{}, {"Content-Type": "application/octet-stream"},
                                     {"Content-Type": "image/png", "Content-Encoding": "zstd"}])
@pytest.mark.parametrize("where", ["no-such-model/versions/000000000000", f"{MODEL}/versions/000000000000"])
def test_an_unknown_model_or_version_is_a_404_before_the_content_type_is_judged(client, headers, where):
    r = client.post(f"/v1/models/{where}/patterns/input-png/infer", content=_png(SHIRT), headers=headers)
    assert r.status_code == 404, r.text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=3000), signed=st.booleans())
def test_fuzz_the_image_route_never_5xx(client, body, signed):
    if signed:
        body = b"\x89PNG\r\n\x1a\n" + body
    r = client.post(_image_url(client), content=body, headers={"Content-Type": "image/png"})
    assert 400 <= r.status_code < 500 or r.status_code == 200, r.text


def test_served_images_price_the_next_image_plans(cnn_only):
    with make_client(cnn_only) as fresh:
        engine = fresh.app.state.engine
        version = fresh.get(f"/v1/models/{MODEL}").json()["version"]
        key = (MODEL, version)
        assert engine.image_times.samples(key) == 0
        url = _image_url(fresh)
        for _ in range(3):
            answer = fresh.post(url, content=_png(NOISE), headers={"Content-Type": "image/png"})
            assert answer.status_code == 200
        assert engine.image_times.samples(key) == 3  # the price is now theirs (ImageTimes.LEAST)
