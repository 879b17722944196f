"""The device's offer of its input image (ADR 0014): a PNG only where the server, preprocessing that
PNG as the card says, gets exactly the model input the device made of the file; else no offer."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from qpart.client.errors import DeviceInputError
from qpart.client.inputs import png_of_file, read_image_files
from qpart.models.preprocess import FASHION_MNIST_SPEC, PreprocessSpec, preprocess_image

RGB = PreprocessSpec(color="RGB", resize=64, center_crop=(64, 64), mean=(0.3, 0.3, 0.3),
                     std=(0.35, 0.35, 0.35))
_RNG = np.random.default_rng(0)
_GRAY = _RNG.integers(0, 256, (28, 28), dtype=np.uint8)


def _server_input(png: bytes, spec: PreprocessSpec) -> np.ndarray:
    with Image.open(io.BytesIO(png), formats=["PNG"]) as image:
        return preprocess_image(image, spec)


@pytest.mark.parametrize(("name", "make"), [
    ("gray.png", lambda: Image.fromarray(_GRAY, "L")),
    ("palette.png", lambda: Image.fromarray(_GRAY, "L").convert("P")),
    ("rgba.png", lambda: Image.fromarray(np.stack([_GRAY] * 4, -1), "RGBA")),
    ("wide16.png", lambda: Image.fromarray(_GRAY.astype(np.uint16) * 257)),
    ("int32.tif", lambda: Image.fromarray(_GRAY.astype(np.int32) * 100_000)),
    ("float.tif", lambda: Image.fromarray(_GRAY.astype(np.float32) / 255)),
    ("cmyk.jpg", lambda: Image.fromarray(np.stack([_GRAY] * 3, -1), "RGB").convert("CMYK")),
    ("ycbcr.tif", lambda: Image.fromarray(np.stack([_GRAY] * 3, -1), "RGB").convert("YCbCr")),
])
@pytest.mark.parametrize("spec", [FASHION_MNIST_SPEC, RGB])
def test_an_offered_png_gives_the_server_the_devices_input_or_is_not_offered(tmp_path: Path, name, make,
                                                                           spec):
    path = tmp_path / name
    make().save(path)
    model_input = read_image_files([path], spec)[0]
    offer = png_of_file(path, spec, model_input)  # never raises for a readable image
    if offer is not None:
        png, width, height, seconds = offer
        assert np.array_equal(_server_input(png, spec), model_input)
        assert (width, height) == (28, 28) and seconds > 0
    if name == "int32.tif":  # Pillow cannot write 32-bit integer pixels as a PNG: the review's 500
        assert offer is None
    if name in ("gray.png", "palette.png"):
        assert offer is not None


def test_an_unreadable_file_is_one_error_naming_it(tmp_path: Path):
    path = tmp_path / "x.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    with pytest.raises(DeviceInputError, match=r"x\.png is not a readable image"):
        png_of_file(path, FASHION_MNIST_SPEC, np.zeros((1, 28, 28), np.float32))


def _asking(tmp_path: Path, answers: list[tuple[int, str]]):
    """A device whose server answers each /v1/plan with the next of ``answers``; the bodies it got."""
    import json

    import httpx

    from qpart.client.device import DeviceClient
    from qpart.client.settings import DeviceSettings
    from qpart.client.transport import Transport

    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/plan"
        bodies.append(json.loads(request.content))
        status, error = answers[len(bodies) - 1]
        return httpx.Response(status, json={"error": error})

    settings = DeviceSettings(server="http://server.test", cache_dir=tmp_path / "cache", retries=0)
    mock = httpx.Client(base_url=settings.server, transport=httpx.MockTransport(handler))
    return DeviceClient(settings, transport=Transport(settings, mock)), bodies


OFFER = {"png_bytes": 500, "width": 28, "height": 28, "encode_s": 1e-4}


def test_a_server_refusing_the_offer_is_asked_again_without_it(tmp_path: Path):
    from qpart.client.errors import ServerRejectedError

    refused = "body.input_image: Extra inputs are not permitted"  # a server from before ADR 0014
    device, bodies = _asking(tmp_path, [(422, refused), (400, "no such model")])
    with device, pytest.raises(ServerRejectedError, match="no such model"):
        device.plan("m", 0.01, input_image=OFFER)
    assert [("input_image" in b) for b in bodies] == [True, False]  # asked again, without it
    assert bodies[1] == {k: v for k, v in bodies[0].items() if k != "input_image"}


@pytest.mark.parametrize(("status", "error"), [(422, "body.accuracy_demand: less than 1"),
                                               (400, "input_image is not what the model takes"),
                                               (503, "draining")])
def test_any_other_refusal_is_the_error_itself(tmp_path: Path, status, error):
    from qpart.client.errors import DeviceError

    device, bodies = _asking(tmp_path, [(status, error)] * 3)
    with device, pytest.raises(DeviceError):
        device.plan("m", 0.01, input_image=OFFER)
    assert all("input_image" in b for b in bodies)  # never retried without the offer


def test_the_offer_carries_no_metadata_the_server_would_refuse(tmp_path: Path, monkeypatch):
    from PIL import ImageFile, PngImagePlugin

    from qpart.server.planning.images import decode_png

    server_cap = PngImagePlugin.MAX_TEXT_CHUNK  # the server's (64 KiB), set when it is imported
    path = tmp_path / "icc.png"
    Image.fromarray(_GRAY, "L").save(path, icc_profile=bytes(range(256)) * 800)  # 200 KB profile
    with monkeypatch.context() as device:  # a device process: Pillow's own cap, 1 MiB
        device.setattr(PngImagePlugin, "MAX_TEXT_CHUNK", ImageFile.SAFEBLOCK)
        model_input = read_image_files([path], FASHION_MNIST_SPEC)[0]
        offer = png_of_file(path, FASHION_MNIST_SPEC, model_input)
    assert server_cap == PngImagePlugin.MAX_TEXT_CHUNK
    assert offer is not None and len(offer[0]) < 2_000 and b"iCCP" not in offer[0]
    served = decode_png(offer[0], FASHION_MNIST_SPEC, (1, 28, 28), 1 << 24)[0]
    np.testing.assert_array_equal(served, model_input)
