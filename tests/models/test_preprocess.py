"""The preprocessing spec: validation with one-line errors, torchvision's resize and crop
arithmetic, exact float32 values, and the Fashion-MNIST reference reproducing load_split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from qpart.models.data import Split, load_split, load_split_pixels
from qpart.models.errors import PreprocessError
from qpart.models.preprocess import (
    FASHION_MNIST_SPEC,
    PreprocessSpec,
    normalize_pixels,
    pixel_table,
    preprocess_image,
    to_pixels,
)

IMAGENET = PreprocessSpec(color="RGB", resize=256, center_crop=(224, 224),
                          mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def gradient(width: int, height: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(width * 1000 + height)
    shape = (height, width, 3) if mode == "RGB" else (height, width)
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))


@pytest.mark.parametrize("split", [Split.TEST, Split.CALIBRATION])
def test_fashion_mnist_spec_reproduces_load_split_bit_for_bit(split):
    expected = load_split(split, limit=3000)
    pixels, _, _ = load_split_pixels(split, limit=3000)
    got = np.stack([preprocess_image(Image.fromarray(p), FASHION_MNIST_SPEC) for p in pixels])
    assert got.dtype == np.float32 and got.shape == expected.images.shape
    assert got.tobytes() == expected.images.tobytes()


def test_pixel_table_divides_exactly_where_a_float32_product_would_not():
    table = pixel_table(FASHION_MNIST_SPEC)[0]
    values = np.arange(256, dtype=np.float32)
    assert table.tobytes() == (values / np.float32(255.0)).tobytes()
    assert (values * np.float32(1 / 255) != table).any()  # why the table is computed in float64


@pytest.mark.parametrize("field", ["mean", "std"])
def test_mean_or_std_of_the_wrong_length_is_one_line_naming_the_fix(field):
    values = {"mean": (0.5, 0.5, 0.5), "std": (0.2, 0.2, 0.2), field: (0.5,)}
    message = rf"{field} has 1 values but color mode RGB has 3 channels"
    with pytest.raises(PreprocessError, match=message) as err:
        PreprocessSpec(color="RGB", **values)
    assert "\n" not in str(err.value)
    with pytest.raises(PreprocessError, match=rf"give one {field} per channel"):
        PreprocessSpec.from_mapping({"color": "RGB", **{k: list(v) for k, v in values.items()}})


@pytest.mark.parametrize("raw, names", [
    ({"color": "CMYK", "mean": [0], "std": [1]}, "color"),
    ({"color": "L", "mean": [0], "std": [0]}, "std.0"),
    ({"color": "L", "mean": [0], "std": [1], "resize": "256"}, "resize"),
    ({"color": "L", "mean": [0], "std": [1], "center_crop": [0, 5]}, "center_crop.0"),
    ({"color": "L", "mean": [0], "std": [1], "scale": -1}, "scale"),
    ({"color": "L", "mean": [0], "std": [1], "layout": "HWC"}, "layout"),
    ({"color": "L", "mean": [0], "std": [1], "gamma": 2}, "gamma"),
    ({"color": "L", "std": [1]}, "mean"),
])
def test_invalid_specs_from_a_card_are_one_line_errors(raw, names):
    with pytest.raises(PreprocessError, match=names) as err:
        PreprocessSpec.from_mapping(raw)
    assert "\n" not in str(err.value)


def test_non_finite_numbers_are_refused():
    with pytest.raises(PreprocessError, match="not a JSON object"):
        PreprocessSpec.from_mapping({"color": "L", "mean": [float("nan")], "std": [1]})


def test_from_python_the_spec_is_strict():
    with pytest.raises(ValueError, match="tuple"):
        PreprocessSpec(color="L", mean=[0.0], std=(1.0,))  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(color=st.sampled_from(["L", "RGB"]),
       resize=st.one_of(st.none(), st.integers(1, 512), st.tuples(st.integers(1, 512), st.integers(1, 512))),
       crop=st.one_of(st.none(), st.tuples(st.integers(1, 512), st.integers(1, 512))),
       scale=st.floats(1e-4, 10), mean=st.floats(-10, 10), std=st.floats(1e-3, 10))
def test_a_spec_round_trips_through_its_json_form(color, resize, crop, scale, mean, std):
    channels = 1 if color == "L" else 3
    spec = PreprocessSpec(color=color, resize=resize, center_crop=crop, scale=scale,
                          mean=(mean,) * channels, std=(std,) * channels)
    assert PreprocessSpec.from_mapping(spec.model_dump(mode="json")) == spec


@pytest.mark.parametrize("size, expected", [((300, 200), (384, 256)), ((200, 300), (256, 384)),
                                            ((256, 256), (256, 256)), ((1000, 333), (768, 256))])
def test_shorter_side_resize_keeps_the_aspect_ratio_as_torchvision_truncates(size, expected):
    spec = PreprocessSpec(color="RGB", resize=256, mean=(0, 0, 0), std=(1, 1, 1))
    pixels = to_pixels(gradient(*size), spec)
    assert pixels.shape == (3, expected[1], expected[0])  # (w, h) -> CHW


def test_center_crop_takes_torchvision_offsets():
    image = gradient(11, 8)
    spec = PreprocessSpec(color="RGB", center_crop=(3, 4), mean=(0, 0, 0), std=(1, 1, 1))
    top, left = round((8 - 3) / 2.0), round((11 - 4) / 2.0)  # 2 (banker's rounding of 2.5), 4 (3.5 -> 4)
    expected = np.asarray(image).transpose(2, 0, 1)[:, top:top + 3, left:left + 4]
    assert np.array_equal(to_pixels(image, spec), expected)


def test_imagenet_style_spec_gives_its_output_shape_and_channel_statistics():
    image = gradient(640, 480)
    out = preprocess_image(image, IMAGENET)
    assert out.shape == IMAGENET.output_shape == (3, 224, 224) and out.dtype == np.float32
    pixels = to_pixels(image, IMAGENET).astype(np.float64)
    for c in range(3):
        expected = ((pixels[c] / 255 - IMAGENET.mean[c]) / IMAGENET.std[c]).astype(np.float32)
        assert np.array_equal(out[c], expected)


def test_an_image_smaller_than_the_crop_is_refused():
    spec = PreprocessSpec(color="L", center_crop=(32, 32), mean=(0,), std=(1,))
    with pytest.raises(PreprocessError, match="smaller than the center crop 32x32; resize"):
        to_pixels(gradient(20, 40, "L"), spec)


def test_an_extreme_aspect_ratio_under_a_shorter_side_resize_is_refused():
    spec = PreprocessSpec(color="L", resize=512, mean=(0,), std=(1,))
    with pytest.raises(PreprocessError, match="pixels long"):
        to_pixels(Image.new("L", (1, 200_000)), spec)


def test_color_conversion_follows_the_declared_mode():
    rgb = gradient(9, 7)
    gray = to_pixels(rgb, PreprocessSpec(color="L", mean=(0,), std=(1,)))
    assert gray.shape == (1, 7, 9)
    assert np.array_equal(gray[0], np.asarray(rgb.convert("L")))
    as_rgb = to_pixels(rgb.convert("L"), PreprocessSpec(color="RGB", mean=(0, 0, 0), std=(1, 1, 1)))
    assert as_rgb.shape == (3, 7, 9) and (as_rgb[0] == as_rgb[1]).all() and (as_rgb[1] == as_rgb[2]).all()
    rgba = rgb.copy()
    rgba.putalpha(0)
    assert np.array_equal(to_pixels(rgba, IMAGENET), to_pixels(rgb, IMAGENET))  # alpha is dropped


def test_preprocessing_is_deterministic_and_leaves_the_image_alone():
    image = gradient(300, 301)
    before = image.tobytes()
    first, second = preprocess_image(image, IMAGENET), preprocess_image(image, IMAGENET)
    assert first.tobytes() == second.tobytes() and image.tobytes() == before


def test_normalize_pixels_checks_its_input_and_fills_a_given_buffer():
    pixels = np.random.default_rng(0).integers(0, 256, (4, 3, 5, 6), dtype=np.uint8)
    out = np.empty(pixels.shape, np.float32)
    assert normalize_pixels(pixels, IMAGENET, out=out) is out
    assert np.array_equal(out, np.stack([preprocess_array(p) for p in pixels]))
    with pytest.raises(PreprocessError, match="not uint8"):
        normalize_pixels(pixels[:, :1], IMAGENET)
    with pytest.raises(PreprocessError, match="not uint8"):
        normalize_pixels(pixels.astype(np.int16), IMAGENET)  # type: ignore[arg-type]
    with pytest.raises(PreprocessError, match="output buffer"):
        normalize_pixels(pixels, IMAGENET, out=np.empty((4, 3, 5, 5), np.float32))
    with pytest.raises(PreprocessError, match="output buffer"):
        normalize_pixels(pixels, IMAGENET, out=np.empty((4, 3, 6, 5), np.float32).transpose(0, 1, 3, 2))


def preprocess_array(pixels: np.ndarray) -> np.ndarray:
    out = np.empty(pixels.shape, np.float32)
    for c in range(3):
        out[c] = ((pixels[c] * (1 / 255) - IMAGENET.mean[c]) / IMAGENET.std[c]).astype(np.float32)
    return out


def test_values_that_overflow_float32_are_refused():
    spec = PreprocessSpec(color="L", scale=1e30, mean=(0,), std=(1e-30,))
    with pytest.raises(PreprocessError, match="overflow float32"):
        pixel_table(spec)
