"""The lossy input-image plan (ADR 0015) over HTTP: announced in ``/v2`` metadata, planned only for a
quality the calibration promises at the demand, served from the WebP exactly as the card's
preprocessing and the float model answer the decoded image, and every wrong body, type or quality a
4xx naming why, on the router and the fast path alike; the bounded header parser fuzzed."""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from qpart.models.data import Split, load_split_pixels
from qpart.models.image_codecs import decode_webp, encode_webp
from qpart.models.preprocess import preprocess_image
from qpart.models.registry import get_model
from qpart.profiles.artifacts import load_artifact
from qpart.server.errors import BadRequestError
from qpart.server.planning.webp import webp_size
from tests.server.conftest import make_client

MODEL = "fmnist-cnn"
WEBP_TYPE = {"Content-Type": "image/webp"}
PIXELS = load_split_pixels(Split.TEST, 8)[0]


@pytest.fixture(scope="module", params=[True, False], ids=["fast-path", "router"])
def any_client(request, cnn_only) -> Iterator[TestClient]:
    with make_client(cnn_only, inference_fast_path=request.param) as c:
        yield c


@pytest.fixture(scope="module")
def ladder(cnn_only):
    found = load_artifact(cnn_only / MODEL).image_ladder
    assert found is not None, "the committed fmnist-cnn artifact carries its image ladder"
    return found


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _plan(client: TestClient, image: Image.Image, qualities: list[int], demand: float = 0.01,
          claimed_bytes: int | None = None, **extra: object) -> dict:
    offer = {"png_bytes": len(_png(image)), "width": image.width, "height": image.height, "encode_s": 1e-4,
             "webp": [{"quality": q, "bytes": claimed_bytes or len(encode_webp(image, q)), "encode_s": 3e-4}
                      for q in qualities]}
    body = {"model": MODEL, "accuracy_demand": demand, "rate_bps": 1e6, "device": "raspberry-pi-4",
            "input_image": offer, **extra}
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _lowest(ladder, demand: float) -> int:
    return min(r.quality for r in ladder.rungs if r.level is not None and r.level <= demand)


def test_the_metadata_lists_the_promised_qualities_with_their_levels(client, ladder):
    listed = json.loads(client.get(f"/v2/models/{MODEL}").json()["parameters"]["image_qualities"])
    assert listed == [{"codec": "webp", "quality": r.quality, "level": r.level, "encoder": ladder.encoder}
                      for r in sorted(ladder.rungs, key=lambda r: r.quality) if r.levels]
    promised = [r for r in ladder.rungs if r.level is not None]
    assert promised and all(r.test_drop is not None and r.test_drop <= r.level for r in promised)


def test_a_promised_quality_is_planned_and_priced_at_its_bytes(client, ladder):
    image = Image.fromarray(PIXELS[0], "L")
    q = _lowest(ladder, 0.01)
    plan = _plan(client, image, [q])
    assert plan["plan_id"].endswith(f"/input-webp@{q}") and plan["upload_content_type"] == "image/webp"
    rung = next(r for r in ladder.rungs if r.quality == q)
    assert (plan["cut"], plan["segment"], plan["level"]) == (0, None, rung.level)
    assert plan["infer_url"].endswith(f"/patterns/input-webp@{q}/infer")
    info = client.get(f"/v1/models/{MODEL}").json()
    # the WebP's bytes, the answer's and one exchange's headers (server.planning.planner.HTTP_EXCHANGE_BYTES)
    assert plan["predicted"]["transfer_bytes"] == len(encode_webp(image, q)) + info["answer_bytes"] + 768
    assert plan["predicted"]["time_s"]["local"] == pytest.approx(3e-4)
    without = _plan(client, image, [])  # a real image's PNG (about 400 B) loses to the cut-0 packet
    assert not without["plan_id"].split("/")[-1].startswith("input-webp")
    assert plan["predicted"]["objective"] < without["predicted"]["objective"]


def test_a_quality_not_promised_at_the_demand_is_not_planned(client, ladder):
    image = Image.fromarray(PIXELS[1], "L")
    loose = [r for r in ladder.rungs if r.level is not None and r.level > 0.005]
    assert loose, "some quality of the ladder is promised only at a looser level than 0.5%"
    for rung in loose:  # 10 B: cheaper than any plan, so chosen wherever it is a candidate at all
        plan = _plan(client, image, [rung.quality], demand=0.005, claimed_bytes=10)
        assert not plan["plan_id"].endswith(f"/input-webp@{rung.quality}")
        at_its_level = _plan(client, image, [rung.quality], demand=rung.level, claimed_bytes=10)
        assert at_its_level["plan_id"].endswith(f"/input-webp@{rung.quality}")
    never = [q for q in (1, 33, 99) if all(r.quality != q or not r.levels for r in ladder.rungs)]
    plan = _plan(client, image, never, demand=0.02, claimed_bytes=10)
    assert not plan["plan_id"].split("/")[-1].startswith("input-webp")


def test_a_batch_gets_no_image_plan(client, ladder):
    plan = _plan(client, Image.fromarray(PIXELS[0], "L"), [_lowest(ladder, 0.01)], batch=2)
    assert plan["upload_content_type"] == "application/octet-stream"


def test_the_webp_is_answered_as_the_float_model_answers_its_decoded_image(any_client, ladder):
    model = get_model(MODEL)
    net = model.load().eval()
    q = _lowest(ladder, 0.01)
    url = _plan(any_client, Image.fromarray(PIXELS[0], "L"), [q])["infer_url"]
    for pixels in PIXELS[:4]:
        body = encode_webp(Image.fromarray(pixels, "L"), q)
        r = any_client.post(url, content=body, headers={"Content-Type": "image/webp"})
        assert r.status_code == 200, r.text
        assert "decode;dur=" in r.headers["server-timing"]
        x = preprocess_image(decode_webp(body), model.preprocess)[None]
        with torch.inference_mode():
            want = net(torch.from_numpy(x)).numpy()[0]
        np.testing.assert_allclose(r.json()["results"][0]["logits"], want, rtol=1e-4, atol=1e-4)


def test_wrong_types_codings_and_qualities_are_4xx_naming_why(any_client, ladder):
    q = _lowest(ladder, 0.01)
    image = Image.fromarray(PIXELS[2], "L")
    webp, png = encode_webp(image, q), _png(image)
    base = f"/v1/models/{MODEL}/versions/{_version(any_client)}/patterns"
    cases = [
        (f"{base}/input-webp@{q}/infer", png, {"Content-Type": "image/png"}, 415, "image/webp"),
        (f"{base}/input-webp@{q}/infer", webp, {}, 415, "no Content-Type"),
        (f"{base}/input-webp@{q}/infer", webp, {"Content-Type": "image/webp", "Content-Encoding": "gzip"},
         415, "Content-Encoding"),
        (f"{base}/input-png/infer", webp, {"Content-Type": "image/webp"}, 415, "image/png"),
        (f"{base}/input-webp@7/infer", webp, {"Content-Type": "image/webp"}, 404, "promises WebP qualities"),
        (f"{base}/input-webp@7/infer", png, {"Content-Type": "image/png"}, 404, "promises WebP qualities"),
        (f"{base}/input-webp@{q}/infer", _inter_frame(webp), WEBP_TYPE, 400, "key frame"),
        (f"{base}/input-webp@{q}/infer", webp[:23] + b"\0\0\0" + webp[26:], WEBP_TYPE, 400, "key frame"),
        (f"{base}/input-webp@{q}/infer", _riff_sized(webp, len(webp) + 2) + b"\0\0", WEBP_TYPE, 400,
         "does not fill the body"),
        (f"/v1/models/nope/versions/x/patterns/input-webp@{q}/infer", webp, {"Content-Type": "image/webp"},
         404, "nope"),
        (f"{base}/input-webp@{q}/infer", b"", {"Content-Type": "image/webp"}, 400, "empty"),
        (f"{base}/input-webp@{q}/infer", webp[:-4], {"Content-Type": "image/webp"}, 400, "RIFF size"),
        (f"{base}/input-webp@{q}/infer", png, {"Content-Type": "image/webp"}, 400, "RIFF/WEBP"),
        (f"{base}/input-webp@{q}/infer", _lossless(image), {"Content-Type": "image/webp"}, 400, "'VP8 '"),
        (f"{base}/input-webp@{q}/infer", _with_alpha(image), {"Content-Type": "image/webp"}, 400, "'VP8 '"),
        (f"{base}/input-webp@{q}/infer", _declaring(webp, 16000, 16000), {"Content-Type": "image/webp"},
         400, "16000x16000, over the server's bound"),
    ]
    for url, body, headers, status, words in cases:
        r = any_client.post(url, content=body, headers=headers)
        assert r.status_code == status, (url, headers, r.text)
        assert words in r.json()["error"], (words, r.text)


def _version(client: TestClient) -> str:
    return str(client.get(f"/v1/models/{MODEL}").json()["version"])


def _inter_frame(webp: bytes) -> bytes:
    """``webp`` with its frame tag's key-frame bit cleared (bit 0 set: an inter frame)."""
    return webp[:20] + bytes([webp[20] | 1]) + webp[21:]


def _riff_sized(webp: bytes, total: int) -> bytes:
    """``webp`` whose RIFF header says the file is ``total`` bytes (its VP8 chunk's size unchanged)."""
    return webp[:4] + struct.pack("<I", total - 8) + webp[8:]


def _declaring(webp: bytes, width: int, height: int) -> bytes:
    """``webp`` with its key frame's header saying another size (read before any pixel is)."""
    return webp[:26] + struct.pack("<HH", width, height) + webp[30:]


def _lossless(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, "WEBP", lossless=True)
    return buffer.getvalue()


def _with_alpha(image: Image.Image) -> bytes:
    rgba = image.convert("RGBA")
    rgba.putpixel((0, 0), (0, 0, 0, 0))
    buffer = io.BytesIO()
    rgba.save(buffer, "WEBP", quality=75)
    return buffer.getvalue()


def test_a_large_webp_decodes_off_the_event_loop_as_a_small_one_does(any_client, ladder):
    q = _lowest(ladder, 0.01)
    noise = np.random.default_rng(5).integers(0, 256, (512, 512), dtype=np.uint8)
    body = encode_webp(Image.fromarray(noise, "L"), 95)
    assert len(body) > 64 << 10  # over the server's inline bound: decoded in a worker thread
    url = f"/v1/models/{MODEL}/versions/{_version(any_client)}/patterns/input-webp@{q}/infer"
    r = any_client.post(url, content=body, headers={"Content-Type": "image/webp"})
    assert r.status_code == 200, r.text
    model = get_model(MODEL)
    x = preprocess_image(decode_webp(body), model.preprocess)[None]
    with torch.inference_mode():
        want = model.load().eval()(torch.from_numpy(x)).numpy()[0]
    np.testing.assert_allclose(r.json()["results"][0]["logits"], want, rtol=1e-4, atol=1e-4)


def test_the_header_parser_reads_what_pillow_reads():
    for side in [(28, 28), (1, 1), (64, 17), (300, 2)]:
        body = encode_webp(Image.new("RGB", side, (90, 10, 200)), 80)
        assert webp_size(body) == side == decode_webp(body).size


HEADER = encode_webp(Image.fromarray(PIXELS[0], "L"), 75)


@given(st.lists(st.tuples(st.integers(0, 29), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(-3, 3))
@settings(max_examples=600, deadline=None)
def test_the_header_parser_takes_only_a_whole_simple_key_frame(changes, grow):
    """Header fields of a real WebP mutated (and its body grown or cut): the parser either refuses
    with a bad request, or every field it checks still holds and its size is the frame's own."""
    body = bytearray(HEADER)
    for i, value in changes:
        body[i] = value
    body = body + b"\0" * grow if grow >= 0 else body[:grow]
    try:
        width, height = webp_size(bytes(body))
    except BadRequestError:
        return
    riff, chunk = struct.unpack("<I", body[4:8])[0], struct.unpack("<I", body[16:20])[0]
    assert body[:4] == b"RIFF" and body[8:16] == b"WEBPVP8 " and riff + 8 == len(body)
    assert 20 + chunk + (chunk & 1) == len(body) and not body[20] & 1 and body[23:26] == b"\x9d\x01\x2a"
    assert (width, height) == tuple(v & 0x3FFF for v in struct.unpack("<HH", body[26:30]))


@given(st.binary(min_size=0, max_size=64))
@settings(max_examples=300, deadline=None)
def test_the_header_parser_refuses_other_bytes_with_a_bad_request(data):
    body = b"RIFF" + struct.pack("<I", len(data) + 4) + b"WEBP" + data
    for candidate in (data, body):
        if candidate[12:16] != b"VP8 " or len(candidate) < 30:  # not even the start of a simple WebP
            with pytest.raises(BadRequestError):
                webp_size(candidate)


@given(st.data())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_mutated_webps_are_answered_or_refused_never_a_500(client, ladder, data):
    q = _lowest(ladder, 0.01)
    body = bytearray(encode_webp(Image.fromarray(PIXELS[data.draw(st.integers(0, 7))], "L"), q))
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        body = body[: data.draw(st.integers(0, len(body)))]
    url = f"/v1/models/{MODEL}/versions/{_version(client)}/patterns/input-webp@{q}/infer"
    r = client.post(url, content=bytes(body), headers={"Content-Type": "image/webp"})
    assert r.status_code in (200, 400, 422), r.text
    assert ("results" in r.json()) if r.status_code == 200 else r.json()["error"]
