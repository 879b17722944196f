"""The lossy input-image plan's parser of outside bytes (ADR 0015): a WebP the device encoded at a
quality the calibration promised, made into the model's input by the card's preprocessing.

Only the simple lossy format is taken: ``RIFF`` whose size is the body's, ``WEBP``, then one
``VP8 `` chunk holding a key frame (no ``VP8X`` extended header, so no alpha, animation, ICC or
EXIF, and no lossless ``VP8L``). Its size is read from the key frame's header, bounds-checked, and
checked against :func:`~server.planning.images.image_fits` before Pillow's WebP plugin (the only one tried)
decodes a pixel; every failure is a :class:`~server.errors.BadRequestError` naming why.
"""

from __future__ import annotations

import io
import struct
from typing import Literal

import numpy as np
import numpy.typing as npt
from PIL import Image, UnidentifiedImageError

from qpart.models.image_codecs import encode_webp
from qpart.models.preprocess import PreprocessSpec
from qpart.server.errors import BadRequestError
from qpart.server.planning.images import PIL_ERRORS, finish_image, image_fits, probe_image, time_decoding

CONTENT_TYPE: Literal["image/webp"] = "image/webp"  # models.image_codecs.CONTENT_TYPES[WEBP]
VP8_START = b"\x9d\x01\x2a"
HEADER_BYTES = 30  # RIFF (12) + chunk header (8) + frame tag (3) + start code (3) + sizes (4)
_SIMPLE = ("send a lossy WebP in the simple format (one 'VP8 ' chunk: no alpha, animation or "
           "metadata), as the calibrated encoder writes it")


def webp_size(body: bytes) -> tuple[int, int]:
    """``(width, height)`` from a simple lossy WebP's headers (its first 30 bytes, with the RIFF and
    chunk sizes checked against the body's length), read before Pillow sees the body.

    Raises:
        BadRequestError: the body is not a simple lossy WebP.
    """
    if not body:
        raise BadRequestError(f"the body is empty; {_SIMPLE}")
    if len(body) < HEADER_BYTES or body[:4] != b"RIFF" or body[8:12] != b"WEBP":
        raise BadRequestError(f"the body is not a WebP image: it lacks the RIFF/WEBP header; {_SIMPLE}")
    riff, = struct.unpack("<I", body[4:8])
    if riff + 8 != len(body):
        raise BadRequestError(f"the WebP's RIFF size says {riff + 8} bytes, the body has {len(body)}; "
                              "send the whole file, and nothing after it")
    if body[12:16] != b"VP8 ":
        raise BadRequestError(f"the WebP's first chunk is {body[12:16]!r}, not 'VP8 '; {_SIMPLE}")
    chunk, = struct.unpack("<I", body[16:20])
    if chunk < 10 or 20 + chunk + (chunk & 1) != len(body):
        raise BadRequestError(f"the WebP's VP8 chunk of {chunk} bytes does not fill the body; {_SIMPLE}")
    if body[20] & 1 or body[23:26] != VP8_START:
        raise BadRequestError("the WebP's VP8 data does not start with a key frame; send a still image")
    width, height = (v & 0x3FFF for v in struct.unpack("<HH", body[26:30]))
    return int(width), int(height)


def open_webp(body: bytes, spec: PreprocessSpec, input_shape: tuple[int, ...],
              max_pixels: int) -> Image.Image:
    """The WebP in ``body``, its headers read and its size checked, opened by Pillow.

    Raises:
        BadRequestError: not a simple lossy WebP, a size the preprocessing cannot make the input
            of, or more pixels than ``max_pixels``.
    """
    width, height = webp_size(body)
    why = image_fits(width, height, spec, input_shape, max_pixels)
    if why is not None:
        raise BadRequestError(f"{why}; send an image the model card's preprocessing takes")
    try:
        image = Image.open(io.BytesIO(body), formats=["WEBP"])
    except UnidentifiedImageError as exc:
        raise BadRequestError(f"the body is not a WebP image Pillow can read; {_SIMPLE}") from exc
    except PIL_ERRORS as exc:
        raise BadRequestError(f"the body is not a WebP image: {exc}") from exc
    if image.size != (width, height) or getattr(image, "n_frames", 1) != 1:
        raise BadRequestError("the WebP's header does not read the same to Pillow; send a still image")
    return image


def decode_webp_input(body: bytes, spec: PreprocessSpec, input_shape: tuple[int, ...],
                      max_pixels: int) -> npt.NDArray[np.float32]:
    """``[1, *input_shape]``: :func:`open_webp`, decoded and preprocessed."""
    return finish_image(open_webp(body, spec, input_shape, max_pixels), spec, input_shape, "WebP")


def probe_webp(spec: PreprocessSpec, input_shape: tuple[int, ...], quality: int) -> bytes | None:
    """A WebP at ``quality`` of :func:`~server.planning.images.probe_image` (None: no such image)."""
    image = probe_image(spec, input_shape)
    return None if image is None else encode_webp(image, quality)


def webp_decode_seconds(spec: PreprocessSpec, input_shape: tuple[int, ...], max_pixels: int,
                        quality: int) -> float:
    """This server's time to decode and preprocess :func:`probe_webp`'s image (median of
    :data:`~server.planning.images.PROBE_RUNS`); 0 when there is none."""
    return time_decoding(probe_webp(spec, input_shape, quality),
                         lambda b: decode_webp_input(b, spec, input_shape, max_pixels))
