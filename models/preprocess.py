"""The preprocessing spec a model declares once, and the one function that applies it to an image.

Calibration, the device client and the demo all turn an image into a tensor through
:func:`preprocess_image` (or its two halves, :func:`to_pixels` then :func:`normalize_pixels`), so
the tensors they feed a model are the same bit for bit.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qpart.models.errors import PreprocessError

MAX_SIDE = 8192
"""The largest height or width a spec may resize or crop to."""
MAX_RESIZED_PIXELS = 1 << 26
"""The most pixels an image may have after a shorter-side resize (a 1×10000 strip resized to a
shorter side of 256 would otherwise become 256×2,560,000)."""

Side = Annotated[int, Field(gt=0, le=MAX_SIDE)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]

ColorMode = Literal["L", "RGB"]
"""``L``: 8-bit grayscale, one channel (Pillow's ITU-R 601-2 luma from RGB). ``RGB``: three
channels; an alpha channel is dropped."""
Interpolation = Literal["nearest", "bilinear", "bicubic"]
"""Pillow's resampling filters, antialiased when shrinking (torchvision's PIL path does the same)."""
Layout = Literal["CHW"]
"""``CHW``: channels first, the layout of a PyTorch ``[N, C, H, W]`` batch."""

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
}
_CHANNELS = {"L": 1, "RGB": 3}


class PreprocessSpec(BaseModel):
    """How an image becomes a model input: ``(pixel * scale - mean[c]) / std[c]`` after color
    conversion, resize and center crop, as float32 in ``layout``.

    Built from Python with tuples (the model is strict); from a card's JSON object use
    :meth:`from_mapping`, which turns every problem into one :class:`PreprocessError` line.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    color: ColorMode = Field(description="Color mode the image is converted to: L (1 channel) or RGB (3).")
    resize: Side | tuple[Side, Side] | None = Field(
        default=None,
        description="An int resizes the shorter side to it, keeping the aspect ratio (torchvision's "
                    "Resize(int)); [H, W] resizes to exactly that; null keeps the size.")
    center_crop: tuple[Side, Side] | None = Field(
        default=None, description="[H, W] cut from the center after the resize (torchvision's CenterCrop).")
    interpolation: Interpolation = Field(default="bilinear", description="Resampling filter of the resize.")
    scale: Positive = Field(default=1 / 255, description="Factor applied to the 0-255 pixel values first.")
    mean: tuple[Finite, ...] = Field(description="Per-channel mean subtracted after scaling.")
    std: tuple[Positive, ...] = Field(description="Per-channel standard deviation divided by last.")
    layout: Layout = Field(default="CHW", description="Memory layout of one sample.")

    @model_validator(mode="after")
    def _check_channels(self) -> PreprocessSpec:
        # PreprocessError is not a ValueError, so pydantic lets it through unwrapped: one line.
        channels = self.channels
        for name, values in (("mean", self.mean), ("std", self.std)):
            if len(values) != channels:
                raise PreprocessError(
                    f"preprocessing {name} has {len(values)} values but color mode {self.color} has "
                    f"{channels} channel{'s' if channels > 1 else ''}; give one {name} per channel")
        return self

    @property
    def channels(self) -> int:
        """Channels of the output: 1 for ``L``, 3 for ``RGB``."""
        return _CHANNELS[self.color]

    @property
    def output_shape(self) -> tuple[int, int, int] | None:
        """``(C, H, W)`` of every output, or None when it depends on the image's size (a
        shorter-side resize without a crop, or neither)."""
        if self.center_crop is not None:
            return (self.channels, *self.center_crop)
        if isinstance(self.resize, tuple):
            return (self.channels, *self.resize)
        return None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, object]) -> PreprocessSpec:
        """The spec from a JSON object (a model card's ``preprocess``), lists for pairs allowed.

        Raises:
            PreprocessError: one line naming each field that is wrong.
        """
        try:
            text = json.dumps(dict(raw), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise PreprocessError(f"preprocessing spec is not a JSON object of numbers and strings: {exc}") \
                from exc
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}"
                                 for err in exc.errors())
            raise PreprocessError(f"preprocessing spec is invalid: {problems}") from exc


FASHION_MNIST_SPEC = PreprocessSpec(color="L", resize=(28, 28), scale=1 / 255, mean=(0.0,), std=(1.0,))
"""The reference models' input: grayscale 28×28 in [0, 1], as :func:`models.data.load_split` gives."""


def _resized_size(size: tuple[int, int], spec: PreprocessSpec) -> tuple[int, int]:
    """Pillow ``(width, height)`` after the spec's resize."""
    width, height = size
    if spec.resize is None:
        return size
    if isinstance(spec.resize, tuple):
        return spec.resize[1], spec.resize[0]
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(spec.resize * long / short)  # torchvision truncates the same way
    if new_long * spec.resize > MAX_RESIZED_PIXELS:
        raise PreprocessError(
            f"image of {width}x{height} would be {new_long} pixels long after resizing its shorter side to "
            f"{spec.resize}; use an exact [H, W] resize or crop the image")
    return (spec.resize, new_long) if width <= height else (new_long, spec.resize)


def output_size(width: int, height: int, spec: PreprocessSpec) -> tuple[int, int]:
    """``(H, W)`` of the input made from a ``width`` x ``height`` image, from its size alone.

    Raises:
        PreprocessError: the preprocessing cannot take an image of that size.
    """
    new_w, new_h = _resized_size((width, height), spec)
    if spec.center_crop is None:
        return new_h, new_w
    crop_h, crop_w = spec.center_crop
    if crop_h > new_h or crop_w > new_w:
        raise PreprocessError(
            f"image is {new_w}x{new_h} after resizing, smaller than the center crop {crop_w}x{crop_h}; "
            f"resize to at least the crop size first")
    return crop_h, crop_w


def to_pixels(image: Image.Image, spec: PreprocessSpec) -> npt.NDArray[np.uint8]:
    """Color conversion, resize and center crop: the 8-bit pixels the model's input is made of.

    Args:
        image: any Pillow image; it is not modified.
        spec: the preprocessing.

    Returns:
        uint8 ``[C, H, W]``, C-contiguous.

    Raises:
        PreprocessError: the image is smaller than the center crop, or would be too large.
    """
    img = image if image.mode == spec.color else image.convert(spec.color)
    size = _resized_size(img.size, spec)
    if size != img.size:
        img = img.resize(size, _RESAMPLE[spec.interpolation])
    if spec.center_crop is not None:
        crop_h, crop_w = spec.center_crop
        width, height = img.size
        if crop_h > height or crop_w > width:
            raise PreprocessError(
                f"image is {width}x{height} after resizing, smaller than the center crop {crop_w}x{crop_h}; "
                f"resize to at least the crop size first")
        top = round((height - crop_h) / 2.0)  # torchvision's CenterCrop offsets
        left = round((width - crop_w) / 2.0)
        img = img.crop((left, top, left + crop_w, top + crop_h))
    pixels = np.asarray(img, dtype=np.uint8)
    if pixels.ndim == 2:
        return np.ascontiguousarray(pixels[None])
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))


@functools.lru_cache(maxsize=64)
def pixel_table(spec: PreprocessSpec) -> npt.NDArray[np.float32]:
    """float32 ``[C, 256]``: the model input value of each 8-bit value in each channel.

    Computed in float64 and rounded once, so ``scale=1/255`` gives exactly ``np.float32(v) / 255``
    (a float32 product ``v * np.float32(1/255)`` differs from it in 126 of the 256 values).
    """
    values = np.arange(256, dtype=np.float64)
    table = np.stack([(values * spec.scale - mean) / std
                      for mean, std in zip(spec.mean, spec.std, strict=True)])
    if not np.isfinite(table).all() or np.abs(table).max() > np.finfo(np.float32).max:
        raise PreprocessError("preprocessing scale, mean and std overflow float32; use smaller values")
    out = table.astype(np.float32)
    out.flags.writeable = False
    return out


def normalize_pixels(pixels: npt.NDArray[np.uint8], spec: PreprocessSpec,
                     out: npt.NDArray[np.float32] | None = None) -> npt.NDArray[np.float32]:
    """Scale, mean and std applied to 8-bit pixels.

    Args:
        pixels: uint8 ``[..., C, H, W]`` (one sample or a batch).
        spec: the preprocessing.
        out: optional C-contiguous float32 array of the same shape to write into.

    Returns:
        float32 of the shape of ``pixels`` (``out`` when given).
    """
    if pixels.dtype != np.uint8 or pixels.ndim < 3 or pixels.shape[-3] != spec.channels:
        raise PreprocessError(
            f"pixels of dtype {pixels.dtype} and shape {pixels.shape} are not "
            f"uint8 [..., {spec.channels}, H, W]")
    if out is None:
        out = np.empty(pixels.shape, dtype=np.float32)
    elif out.shape != pixels.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise PreprocessError(
            f"output buffer {out.dtype} {out.shape} does not match the pixels {pixels.shape}")
    table = pixel_table(spec)
    # Sample by sample: np.take copies its indices to int64 first, 8 bytes a pixel, which for a
    # whole batch of 500 RGB 224x224 images would be a 200 MB temporary per channel.
    rows, out_rows = pixels.reshape(-1, *pixels.shape[-3:]), out.reshape(-1, *pixels.shape[-3:])
    for row, out_row in zip(rows, out_rows, strict=True):
        for channel in range(spec.channels):
            np.take(table[channel], row[channel], out=out_row[channel], mode="clip")
    return out


def preprocess_image(image: Image.Image, spec: PreprocessSpec) -> npt.NDArray[np.float32]:
    """The model input made from one image, deterministic on every machine.

    Args:
        image: any Pillow image.
        spec: the preprocessing.

    Returns:
        float32 ``[C, H, W]``.
    """
    return normalize_pixels(to_pixels(image, spec), spec)

