"""The lossy input-image codec (ADR 0015): the one WebP encoder the calibration measures and the
device runs, and the names its plans go by.

The calibration's promise for a quality holds for images this encoder makes (libwebp through
Pillow, lossy, :data:`WEBP_METHOD`); another encoder at the same quality number makes other bytes,
and the promise does not speak for them. :func:`webp_encoder` names what ran, for the artifact.
"""

from __future__ import annotations

import io
import re

import PIL
from PIL import Image, features

from qpart.models.errors import ImageCodecError

WEBP = "webp"
WEBP_METHOD = 6
"""libwebp's effort (0..6): 6 makes the smallest files; a 28x28 image still encodes in about
0.3 ms on the development host."""
MAX_WEBP_SIDE = 16383
"""libwebp's largest width or height."""
CONTENT_TYPES = {WEBP: "image/webp"}
INPUT_PREFIX = "input-"
_RUNG_ID = re.compile(r"input-(webp)@([1-9][0-9]?|100)")


def rung_id(codec: str, quality: int) -> str:
    """The pattern id of the lossy input-image plan at ``quality`` (``input-webp@75``)."""
    return f"{INPUT_PREFIX}{codec}@{quality}"


def parse_rung_id(pattern_id: str) -> tuple[str, int] | None:
    """``(codec, quality)`` of a lossy input-image plan's id, or None for any other id."""
    match = _RUNG_ID.fullmatch(pattern_id)
    return None if match is None else (match.group(1), int(match.group(2)))


def encode_webp(image: Image.Image, quality: int) -> bytes:
    """``image`` as a lossy WebP at ``quality`` (1..100), without metadata. A grayscale or palette
    image is written as RGB (WebP has no gray mode); an alpha channel is dropped, as every
    preprocessing spec drops it.

    Raises:
        ImageCodecError: ``quality`` is outside 1..100, or a side over :data:`MAX_WEBP_SIDE`.
    """
    if not 1 <= quality <= 100:
        raise ImageCodecError(f"WebP quality {quality} is outside 1..100")
    if max(image.size) > MAX_WEBP_SIDE:
        raise ImageCodecError(f"the image is {image.width}x{image.height}; WebP holds at most "
                              f"{MAX_WEBP_SIDE} pixels a side")
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    buffer = io.BytesIO()
    try:
        rgb.save(buffer, "WEBP", quality=quality, method=WEBP_METHOD, lossless=False, exif=b"",
                 icc_profile=None)
    except (OSError, ValueError) as exc:  # libwebp's own refusals (encoding error N)
        raise ImageCodecError(f"libwebp cannot encode the {image.width}x{image.height} image: {exc}") from exc
    return buffer.getvalue()


def webp_encoder() -> str:
    """The encoder in words, as an artifact records it."""
    return f"Pillow {PIL.__version__}, libwebp {features.version('webp')}, lossy, method {WEBP_METHOD}"


def decode_webp(body: bytes) -> Image.Image:
    """A WebP's pixels, decoded by Pillow's WebP plugin alone. No bounds: the server checks a body
    from the network (``server.planning.webp``) before it comes here; calibration decodes its own bytes.

    Raises:
        OSError, ValueError: Pillow cannot decode the body.
    """
    image = Image.open(io.BytesIO(body), formats=["WEBP"])
    image.load()
    return image
