"""The device offers one image file itself (ADR 0014), over real HTTP to a live server: a small
image goes up as its PNG and is answered as the float model answers its preprocessed input; an
image whose PNG costs more than a packet is run as a plan of the model's own, as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from qpart.client.device import IMAGE_PNG
from qpart.client.runtime import DeviceRuntime
from qpart.client.settings import DeviceSettings
from qpart.models.preprocess import preprocess_image
from qpart.models.registry import get_model

pytestmark = [pytest.mark.integration]


def _float_logits(path) -> np.ndarray:
    model = get_model("fmnist-cnn")
    x = preprocess_image(Image.open(path), model.preprocess)[None]
    with torch.inference_mode():
        return model.load()(torch.from_numpy(x)).numpy()[0]


@pytest.fixture
def shirt(tmp_path):
    pixels = np.zeros((28, 28), np.uint8)
    pixels[4:24, 6:22] = 180
    path = tmp_path / "shirt.png"
    Image.fromarray(pixels).save(path)
    return path


@pytest.fixture
def noise(tmp_path):
    path = tmp_path / "noise.jpg"  # about 800 B as a PNG: more than the cut-0 packet
    pixels = np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)
    Image.fromarray(pixels).save(path, quality=95)
    return path


def _cli(server, path, cache, *env: str) -> dict:
    cmd = [sys.executable, "-m", "qpart", "device", "infer", str(path), "--server", server.url,
           "--cache-dir", str(cache), "--rate-mbps", "1", "--json"]
    environ = dict(pair.split("=", 1) for pair in env)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True,
                         env={**os.environ, **environ}).stdout
    return json.loads(out)


def test_a_small_image_goes_up_as_itself(server, shirt, tmp_path):
    doc = _cli(server, shirt, tmp_path / "cache")
    assert doc["plan"]["upload_content_type"] == IMAGE_PNG and doc["plan"]["plan_id"].endswith("/input-png")
    png_bytes = len(shirt.read_bytes())  # the device re-encodes it; a PNG of the same pixels here
    assert abs(doc["uploaded_bytes"] - png_bytes) <= 64 and doc["downloaded_bytes"] == 0
    np.testing.assert_allclose(doc["results"][0]["logits"], _float_logits(shirt), rtol=1e-5, atol=1e-5)
    assert doc["predictions"][0]["label"] == int(np.argmax(_float_logits(shirt)))


def test_the_offer_can_be_turned_off(server, shirt, tmp_path):
    doc = _cli(server, shirt, tmp_path / "cache", "QPART_DEVICE_OFFER_INPUT_IMAGE=false")
    assert "upload_content_type" not in doc["plan"] or doc["plan"]["upload_content_type"] != IMAGE_PNG
    assert not doc["plan"]["plan_id"].endswith("/input-png")


def test_an_image_dearer_than_a_packet_runs_the_planned_head(server, noise, tmp_path):
    with DeviceRuntime(DeviceSettings(server=server.url, cache_dir=tmp_path / "cache")) as device:
        settled: list[tuple[float, float | None]] = []
        real = device.image_offers.settle

        def settle(offer, *objectives):
            settled.append(objectives)
            real(offer, *objectives)

        device.image_offers.settle = settle
        run = device.infer_images([noise], "fmnist-cnn", 0.01, rate_bps=1e6)
    assert run.plan.upload_content_type != IMAGE_PNG
    assert len(run.predictions) == 1 and run.uploaded_bytes > 0
    # the plan's price of the image it did not send sets the device's next refresh (ADR 0016)
    image = run.plan.input_image_plan
    assert image is not None and image.objective > run.plan.predicted.objective
    assert settled == [(run.plan.predicted.objective, image.objective)]


@pytest.fixture
def sandal(tmp_path):
    from qpart.models.data import Split, load_split_pixels

    path = tmp_path / "sandal.png"  # a real test image: its PNG (about 400 B) loses to the packet
    Image.fromarray(load_split_pixels(Split.TEST, 1)[0][0]).save(path)
    return path


def test_a_real_image_goes_up_as_the_lowest_promised_webp(server, sandal, tmp_path):
    from qpart.client.device import IMAGE_WEBP
    from qpart.models.image_codecs import decode_webp, encode_webp

    with DeviceRuntime(DeviceSettings(server=server.url, cache_dir=tmp_path / "cache")) as device:
        qualities = device.metadata("fmnist-cnn").image_qualities
        quality = min(q for q, level in qualities if level <= 0.01)
        run = device.infer_images([sandal], "fmnist-cnn", 0.01, rate_bps=1e6)
    assert run.plan.upload_content_type == IMAGE_WEBP
    assert run.plan.plan_id.endswith(f"/input-webp@{quality}") and run.plan.level <= 0.01
    body = encode_webp(Image.open(sandal), quality)
    assert run.uploaded_bytes == len(body) and run.downloaded_bytes == 0
    model = get_model("fmnist-cnn")
    x = preprocess_image(decode_webp(body), model.preprocess)[None]
    with torch.inference_mode():
        want = model.load()(torch.from_numpy(x)).numpy()[0]
    np.testing.assert_allclose(run.results[0].logits, want, rtol=1e-5, atol=1e-5)


def _offers(device: DeviceRuntime, monkeypatch) -> list[dict]:
    """What each plan request of ``device`` offered as its input image (recorded, then sent)."""
    offered: list[dict] = []
    real = device._ask

    def ask(body, input_image):
        offered.append(input_image)
        return real(body, input_image)

    monkeypatch.setattr(device, "_ask", ask)
    return offered


def test_a_demand_no_quality_is_promised_at_offers_no_webp(server, sandal, tmp_path, monkeypatch):
    with DeviceRuntime(DeviceSettings(server=server.url, cache_dir=tmp_path / "cache")) as device:
        offered = _offers(device, monkeypatch)
        qualities = device.metadata("fmnist-cnn").image_qualities
        tightest = min(level for _, level in qualities)
        device.infer_images([sandal], "fmnist-cnn", tightest / 2, rate_bps=1e6)
        device.infer_images([sandal], "fmnist-cnn", tightest, rate_bps=1e6)
    assert "webp" not in offered[0] and offered[0]["png_bytes"] > 0
    lowest = min(q for q, level in qualities if level <= tightest)
    assert [o["quality"] for o in offered[1]["webp"]] == [lowest]  # at its level: offered


def test_an_image_webp_cannot_hold_is_offered_as_a_png_only(server, tmp_path, monkeypatch):
    wide = tmp_path / "wide.png"  # WebP holds at most 16,383 pixels a side
    Image.fromarray(np.full((2, 16_384), 200, np.uint8)).save(wide)
    with DeviceRuntime(DeviceSettings(server=server.url, cache_dir=tmp_path / "cache")) as device:
        offered = _offers(device, monkeypatch)
        run = device.infer_images([wide], "fmnist-cnn", 0.02, rate_bps=1e6)
    assert len(run.predictions) == 1
    assert all("webp" not in o for o in offered if o is not None)


def test_a_server_whose_promise_is_for_another_encoder_gets_no_webp(server, sandal, tmp_path, monkeypatch):
    from qpart.client import plans

    monkeypatch.setattr(plans, "webp_encoder", lambda: "Pillow 9.0.0, libwebp 1.2.0, lossy, method 6")
    with DeviceRuntime(DeviceSettings(server=server.url, cache_dir=tmp_path / "cache")) as device:
        offered = _offers(device, monkeypatch)
        assert device.metadata("fmnist-cnn").image_qualities == []
        run = device.infer_images([sandal], "fmnist-cnn", 0.02, rate_bps=1e6)
    assert run.plan.upload_content_type != "image/webp" and "webp" not in offered[0]
