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
