"""The device applies the model card (issue 24, acceptance 3): image files are made into the model's
input by the preprocessing the server announces in ``/v2`` metadata: an RGB JPEG of any size for an
RGB card, and an RGB photo converted to luma for a grayscale card; and over real HTTP, ``qpart
device infer`` on RGB JPEGs gets the classes ``/v2`` infer gives for the tensors the card makes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from qpart.client.device import DeviceClient
from qpart.client.errors import DeviceInputError, ServerAnswerError
from qpart.client.inputs import check_image_files, read_image_files
from qpart.client.settings import DeviceSettings
from qpart.client.transport import Transport
from qpart.models.data import Split, load_split
from qpart.models.preprocess import FASHION_MNIST_SPEC, PreprocessSpec, preprocess_image
from qpart.models.registry import get_model


def _photo(path: Path, gray: np.ndarray, size: tuple[int, int]) -> Path:
    """A Fashion-MNIST image as a tinted RGB JPEG of ``size`` (W, H): three different channels."""
    rgb = np.stack([gray, (gray * 0.6).astype(np.uint8), 255 - (255 - gray) // 2], axis=-1)
    Image.fromarray(rgb, "RGB").resize(size, Image.Resampling.BICUBIC).save(path, quality=92)
    return path


def _card_spec(model: str) -> PreprocessSpec:
    spec = get_model(model).preprocess
    assert spec is not None
    return spec


def _device(tmp_path: Path, parameters: dict[str, str]) -> DeviceClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"name": "m", "parameters": parameters})

    settings = DeviceSettings(server="http://server.test", cache_dir=tmp_path / "cache")
    mock = httpx.Client(base_url=settings.server, transport=httpx.MockTransport(handler))
    return DeviceClient(settings, transport=Transport(settings, mock))


@pytest.fixture(scope="module")
def test_images() -> np.ndarray:
    return (load_split(Split.TEST, limit=12).images[:, 0] * 255).round().astype(np.uint8)


def test_an_rgb_jpeg_of_any_size_becomes_the_rgb_cards_input(tmp_path, test_images):
    spec = _card_spec("fmnist-mobilenet")  # RGB, shorter side to 64, center crop 64×64, mean/std
    paths = [_photo(tmp_path / "a.jpg", test_images[0], (97, 61)),
             _photo(tmp_path / "b.jpg", test_images[1], (40, 300))]
    with _device(tmp_path, {"preprocess": spec.model_dump_json()}) as device:
        batch = device.read_images(paths, "m")
    assert batch.shape == (2, 3, 64, 64) and batch.dtype == np.float32
    for row, path in zip(batch, paths, strict=True):
        with Image.open(path) as img:
            assert np.array_equal(row, preprocess_image(img, spec))
    assert not np.allclose(batch[:, 0], batch[:, 1])  # the channels stay apart


def test_a_grayscale_card_converts_an_rgb_photo_to_luma(tmp_path, test_images):
    spec = _card_spec("fmnist-cnn")  # L, 28×28, [0, 1]
    path = _photo(tmp_path / "c.jpg", test_images[2], (123, 77))
    with _device(tmp_path, {"preprocess": spec.model_dump_json()}) as device:
        (row,) = device.read_images([path], "m")
    with Image.open(path) as img:
        small = img.convert("L").resize((28, 28), Image.Resampling.BILINEAR)
        luma = np.asarray(small, dtype=np.float32) / 255
    assert row.shape == (1, 28, 28)
    assert np.allclose(row[0], luma, atol=1e-6)


def test_a_server_without_a_card_spec_gets_the_reference_models_input(tmp_path, test_images):
    path = _photo(tmp_path / "d.jpg", test_images[3], (28, 28))
    with _device(tmp_path, {}) as device:
        assert np.array_equal(device.read_images([path], "m"), read_image_files([path], FASHION_MNIST_SPEC))


@pytest.mark.parametrize("raw", ["[1, 2]", "{not json",
                                 json.dumps({"color": "RGB", "mean": [0.5], "std": [1]})])
def test_an_announced_spec_that_is_not_valid_is_a_server_answer_error(tmp_path, test_images, raw):
    path = _photo(tmp_path / "e.jpg", test_images[4], (28, 28))
    device = _device(tmp_path, {"preprocess": raw})
    with device, pytest.raises(ServerAnswerError, match="preprocess"):
        device.read_images([path], "m")


def test_images_that_preprocess_to_different_shapes_are_refused(tmp_path, test_images):
    spec = PreprocessSpec(color="L", resize=28, mean=(0.0,), std=(1.0,))  # shorter side only: no crop
    paths = [_photo(tmp_path / "f.jpg", test_images[5], (28, 56)),
             _photo(tmp_path / "g.jpg", test_images[6], (28, 28))]
    with pytest.raises(DeviceInputError, match="different shapes"):
        read_image_files(paths, spec)


@pytest.mark.parametrize(("name", "raw"), [
    ("h.jpg", b"\xff\xd8\xff not a jpeg"),
    ("h.ppm", b"P6\n30 z0\n255\n"),  # a header Pillow's plugin parses with int(): a ValueError
])
def test_a_file_that_is_no_image_is_refused_by_name(tmp_path, name, raw):
    (tmp_path / name).write_bytes(raw)
    for read in (check_image_files, lambda paths: read_image_files(paths, FASHION_MNIST_SPEC)):
        with pytest.raises(DeviceInputError, match=rf"{name.replace('.', '[.]')} is not a readable image"):
            read([tmp_path / name])


def test_an_image_smaller_than_the_crop_is_refused_as_such(tmp_path, test_images):
    spec = PreprocessSpec(color="L", center_crop=(28, 28), mean=(0.0,), std=(1.0,))
    path = _photo(tmp_path / "small.jpg", test_images[7], (20, 20))
    with pytest.raises(DeviceInputError, match=r"small\.jpg: .*center crop") as refused:
        read_image_files([path], spec)
    assert "not a readable image" not in str(refused.value)


def test_a_spec_whose_values_overflow_float32_is_the_servers_error(tmp_path, test_images):
    path = _photo(tmp_path / "i.jpg", test_images[8], (28, 28))
    spec = {"color": "L", "resize": [28, 28], "mean": [0.0], "std": [1e-300]}
    device = _device(tmp_path, {"preprocess": json.dumps(spec)})
    with device, pytest.raises(ServerAnswerError, match="metadata"):
        device.read_images([path], "m")


@pytest.mark.integration
def test_device_infer_on_rgb_jpegs_gets_the_classes_v2_gives_the_cards_tensors(tmp_path, server, test_images):
    spec = _card_spec("fmnist-cnn")
    sizes = [(97, 61), (28, 28), (300, 40), (64, 64), (33, 120), (250, 250)] * 2
    paths = [_photo(tmp_path / f"{i}.jpg", img, size)
             for i, (img, size) in enumerate(zip(test_images, sizes, strict=True))]
    cmd = [sys.executable, "-m", "qpart", "device", "infer", *map(str, paths), "--demand", "0.001",
           "--server", server.url, "--cache-dir", str(tmp_path / "cache"), "--json"]
    doc = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout)
    tensors = np.stack([preprocess_image(Image.open(p), spec) for p in paths])
    body = {"inputs": [{"name": "input", "shape": list(tensors.shape), "datatype": "FP32",
                        "data": tensors.ravel().tolist()}]}
    answer = httpx.post(f"{server.url}/v2/models/fmnist-cnn/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    logits = np.array(answer.json()["outputs"][0]["data"], dtype=np.float32).reshape(len(paths), -1)
    labels = get_model("fmnist-cnn").labels
    assert labels is not None
    assert [p["label"] for p in doc["predictions"]] == logits.argmax(1).tolist()
    assert [p["name"] for p in doc["predictions"]] == [labels[i] for i in logits.argmax(1)]
