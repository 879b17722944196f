"""bench.harness.baseline_routes: the naive baselines' server side answers what the float model answers, over
real HTTP, and refuses bytes it cannot read with a 400."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from bench.e2e.device import server_timing
from bench.harness import autoencoder
from bench.harness.baseline_routes import decode_image, input_tensor
from bench.harness.codecs import encode
from qpart.kernels import wire
from qpart.kernels.wire import encode_quantized_activation
from qpart.models.data import Split, load_split_pixels
from qpart.models.partition import cuts_of, prepare, split
from qpart.models.preprocess import preprocess_image
from qpart.models.registry import get_model
from tests.conftest import free_port

pytestmark = pytest.mark.integration  # a bench.harness.shaped_server process on loopback

AE = Path(__file__).parents[2] / "bench" / "results" / "autoencoder" / "fmnist-cnn-c3"


def _huge_scales() -> bytes:
    """A well-formed bottleneck packet whose finite scales (3e38) decode its top codes to infinity."""
    z = np.linspace(0, 1, 392, dtype=np.float32).reshape(1, 8, 7, 7)
    packet = bytearray(encode_quantized_activation(z, 8, 196))
    scales_at = wire._HEAD.size + 4 * 4
    packet[scales_at : scales_at + 8] = np.full(2, 3e38, "<f4").tobytes()
    return bytes(packet)


@pytest.fixture(scope="module")
def baseline_server(cnn_only: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "QPART_PORT": str(port), "QPART_HOST": "127.0.0.1"}
    proc = subprocess.Popen([sys.executable, "-m", "bench.harness.shaped_server",
                             "--artifacts", str(cnn_only), "--autoencoders", str(AE.parent)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_compressed_image_is_answered_as_the_float_model_answers_its_decoded_pixels(baseline_server):
    pixels = load_split_pixels(Split.TEST, limit=3)[0]
    spec = get_model("fmnist-cnn")
    model = spec.load().eval()
    assert spec.preprocess is not None
    for p in pixels:
        for codec in ("png", "webp@75"):
            body = encode(p, codec)
            r = httpx.post(f"{baseline_server}/bench/input/fmnist-cnn", content=body)
            assert r.status_code == 200, r.text
            x = torch.from_numpy(preprocess_image(decode_image(body), spec.preprocess)[None])
            with torch.inference_mode():
                want = model(x).numpy()[0]
            np.testing.assert_allclose(r.json()["results"][0]["logits"], want, rtol=1e-4, atol=1e-4)
            assert r.json()["compute_s"] > 0
            decode_s = server_timing(r.headers.get("server-timing"))  # the decoding's share, reported
            assert decode_s is not None and 0 < decode_s <= r.json()["compute_s"]


def test_an_autoencoder_packet_is_decoded_and_run_through_decoder_and_tail(baseline_server):
    enc, dec, meta = autoencoder.load(AE)
    spec = get_model("fmnist-cnn")
    gm = prepare(spec.load().eval(), spec.input_shape)
    head, tail = split(gm, cuts_of(gm)[meta.cut])
    x = torch.from_numpy(load_split_pixels(Split.TEST, limit=2)[0][:, None].astype(np.float32) / 255)
    with torch.inference_mode():
        z = enc(head(x[:1])).numpy()
    packet = encode_quantized_activation(z, meta.bits, meta.group_size)
    r = httpx.post(f"{baseline_server}/bench/ae/fmnist-cnn/{meta.cut}", content=packet)
    assert r.status_code == 200, r.text
    want = autoencoder.run_path(head, enc, dec, tail, x[:1], meta.bits, meta.group_size).numpy()[0]
    np.testing.assert_allclose(r.json()["results"][0]["logits"], want, rtol=1e-4, atol=1e-4)
    assert 0 < (server_timing(r.headers.get("server-timing")) or 0) <= r.json()["compute_s"]
    encoder = httpx.get(f"{baseline_server}/bench/ae/fmnist-cnn/{meta.cut}/encoder")
    assert encoder.content == (AE / "encoder.safetensors").read_bytes()


@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/bench/input/fmnist-cnn", b"not an image", 400, "not a PNG, WebP or JPEG"),
    ("/bench/input/no-such-model", b"x", 404, "no-such-model"),
    ("/bench/ae/fmnist-cnn/3", b"QPAX" + bytes(40), 400, "not an activation packet"),
    ("/bench/ae/fmnist-cnn/3", _huge_scales(), 400, "NaN or infinity"),
    ("/bench/ae/fmnist-cnn/3", encode_quantized_activation(np.ones((1, 4, 7, 7), np.float32), 4, 196), 400,
     "this autoencoder's is [1, 8, 7, 7]"),
    ("/bench/ae/fmnist-cnn/3", encode_quantized_activation(np.ones((1, 8, 100, 100), np.float32), 4, 200),
     400, "allowed 1..392"),  # refused by its declared size before decoding
    ("/bench/ae/fmnist-cnn/5", b"x", 404, "no autoencoder"),
    ("/bench/nothing", b"", 404, "no baseline route"),
])
def test_bytes_the_routes_cannot_read_are_a_4xx_naming_why(baseline_server, path, body, status, words):
    r = httpx.post(baseline_server + path, content=body)
    assert r.status_code == status and words in r.json()["error"], r.text
    assert httpx.get(f"{baseline_server}/v2/health/ready").status_code == 200  # nothing wedged


def _received_bytes(url: str) -> float:
    """The product's ``qpart_received_bytes`` for the route label the baselines' paths get."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("qpart_received_bytes_total{") and 'route="other"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_baselines_requests_pass_the_products_limits_and_metrics_as_a_product_request_does(
        baseline_server):
    from qpart.server.settings import ServerSettings

    body = encode(load_split_pixels(Split.TEST, limit=1)[0][0], "png")
    before = _received_bytes(baseline_server)
    assert httpx.post(f"{baseline_server}/bench/input/fmnist-cnn", content=body).status_code == 200
    assert _received_bytes(baseline_server) - before == len(body)  # counted by the product's layer
    limit = ServerSettings.model_fields["max_body_bytes"].default
    r = httpx.post(f"{baseline_server}/bench/input/fmnist-cnn", content=bytes(limit + 1))
    assert r.status_code == 413 and "exceeds the limit" in r.text  # the product's limit, before the route


def test_an_image_the_cards_preprocessing_cannot_take_is_a_value_error_the_route_answers_400():
    buf = io.BytesIO()
    Image.new("L", (20000, 1)).save(buf, "PNG")  # 64 on its short side would be 1.28 M pixels long
    with pytest.raises(ValueError, match="resiz"):
        input_tensor("fmnist-mobilenet", buf.getvalue())
    assert input_tensor("fmnist-cnn", buf.getvalue()).shape == (1, 1, 28, 28)  # an exact resize takes it


def test_only_png_webp_and_jpeg_are_decoded_and_huge_images_are_refused_before_decoding():
    buf = io.BytesIO()
    Image.new("L", (8, 8)).save(buf, "GIF")
    with pytest.raises(ValueError, match="not a PNG, WebP or JPEG"):
        decode_image(buf.getvalue())
    big = io.BytesIO()
    Image.new("1", (5000, 4000)).save(big, "PNG")  # a few kB compressed, 20 Mpixel decoded
    with pytest.raises(ValueError, match="over"):
        decode_image(big.getvalue())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.sampled_from([b"", b"\x89PNG\r\n\x1a\n", b"RIFF\x00\x00\x00\x00WEBPVP8 ",
                                                  b"\xff\xd8\xff\xe0"]))
def test_any_bytes_decode_to_an_image_or_a_value_error(data, magic):
    try:
        image = decode_image(magic + data)
    except ValueError:
        return
    assert image.width * image.height <= 4096 * 4096
