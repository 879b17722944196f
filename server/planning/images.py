"""The input-image plan's one parser of outside bytes (ADR 0014): a PNG the device uploads instead
of its model input, made into that input by the model card's preprocessing.

Only Pillow's PNG plugin is tried; the image's size from its header is checked against
:func:`image_fits` (the card's preprocessing must turn it into the model's input, and it must be
under the server's pixel bound) before a pixel is decoded; every failure is a
:class:`~server.errors.BadRequestError` naming why.
"""

from __future__ import annotations

import io
import statistics
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable
from typing import Literal

import numpy as np
import numpy.typing as npt
from PIL import Image, PngImagePlugin, UnidentifiedImageError

from qpart.models.errors import PreprocessError
from qpart.models.preprocess import PreprocessSpec, output_size, preprocess_image
from qpart.server.errors import BadRequestError

INPUT_PNG = "input-png"
"""The pattern id of the input-image plan (calibrated patterns are ``c<cut>-<digest>``)."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CONTENT_TYPE: Literal["image/png"] = "image/png"
PROBE_RUNS = 31  # start-up timing of decoding and preprocessing: the median of this many runs
MIN_CHUNKS = 256  # chunks any PNG may have (IHDR, PLTE, tRNS, text, APNG frames ...): chunk_allowance

# Pillow's own caps: text chunks (decompressed) are held to these, so a PNG of a few kB cannot
# make the server inflate megabytes of metadata before its pixels.
PngImagePlugin.MAX_TEXT_CHUNK = 64 << 10
PngImagePlugin.MAX_TEXT_MEMORY = 256 << 10


PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error,
               Image.DecompressionBombError, IndexError, TypeError, KeyError)
"""What Pillow raises on bytes it cannot read (UnidentifiedImageError is an OSError; its chunk
parsers raise IndexError on a short iCCP chunk after the image data, found in review)."""


def image_fits(width: int, height: int, spec: PreprocessSpec, input_shape: tuple[int, ...],
               max_pixels: int) -> str | None:
    """Why an image of ``width`` x ``height`` cannot be the model's input (None: it can)."""
    if width < 1 or height < 1:
        return f"the image is {width}x{height}; it has no pixels"
    if width * height > max_pixels:
        return f"the image is {width}x{height}, over the server's bound of {max_pixels} pixels"
    try:
        out_h, out_w = output_size(width, height, spec)
    except PreprocessError as exc:
        return str(exc)
    want = (spec.channels, out_h, out_w)  # CHW, the one layout a spec has
    if tuple(input_shape) != want:
        return (f"the model card's preprocessing makes a {width}x{height} image into "
                f"{list(want)}, not the model's input {list(input_shape)}")
    return None


def png_size(body: bytes) -> tuple[int, int]:
    """``(width, height)`` from a PNG's signature and IHDR chunk (its first 24 bytes), read before
    Pillow sees the body.

    Raises:
        BadRequestError: the body does not start as a PNG does.
    """
    if len(body) < 24 or body[:8] != PNG_SIGNATURE or body[12:16] != b"IHDR":
        raise BadRequestError("the body is not a PNG image: it lacks the PNG signature and IHDR "
                              "chunk; send the input image as a PNG")
    width, height = struct.unpack(">II", body[16:24])
    return int(width), int(height)


def chunk_allowance(body_bytes: int) -> int:
    """How many chunks a PNG of ``body_bytes`` may have before its IEND: encoders write image data
    in chunks of 8 KiB (libpng) to 64 KiB (Pillow), some in 1 KiB ones, so a real image has about
    one chunk per KiB at most, and a body of thousands of tiny chunks is work for the parser with
    no pixels in it."""
    return MIN_CHUNKS + body_bytes // 1024


def check_chunks(body: bytes) -> None:
    """Walk the chunk headers after the signature (length, type; bounds-checked) and refuse a body
    with more chunks than :func:`chunk_allowance` before its IEND. A body cut short, or a chunk
    length past its end, is left for Pillow to name.

    Raises:
        BadRequestError: too many chunks.
    """
    allowed, pos, count = chunk_allowance(len(body)), len(PNG_SIGNATURE), 0
    while pos + 8 <= len(body):
        count += 1
        if count > allowed:
            raise BadRequestError(f"the PNG has more than {allowed} chunks for its {len(body)} bytes "
                                  f"({MIN_CHUNKS} and one a KiB); write its data in larger chunks")
        length = int.from_bytes(body[pos : pos + 4], "big")
        if body[pos + 4 : pos + 8] == b"IEND":
            return
        pos += 12 + length


def open_png(body: bytes, spec: PreprocessSpec, input_shape: tuple[int, ...],
             max_pixels: int) -> Image.Image:
    """The PNG in ``body``, its header read and its size checked (:func:`image_fits`), no pixel
    decoded yet.

    Raises:
        BadRequestError: not a PNG, or a size the preprocessing cannot make the input of, or more
            pixels than ``max_pixels``.
    """
    if not body:
        raise BadRequestError("the body is empty; send the input image as a PNG")
    width, height = png_size(body)
    why = image_fits(width, height, spec, input_shape, max_pixels)
    if why is not None:
        raise BadRequestError(f"{why}; send an image the model card's preprocessing takes")
    check_chunks(body)
    try:
        image = Image.open(io.BytesIO(body), formats=["PNG"])
    except UnidentifiedImageError as exc:
        raise BadRequestError("the body is not a PNG image: it lacks the PNG signature, or its header "
                              "chunk is damaged") from exc
    except PIL_ERRORS as exc:
        raise BadRequestError(f"the body is not a PNG image: {exc}") from exc
    if image.size != (width, height):  # Pillow read the same header; a guard, not a path
        raise BadRequestError("the PNG's header does not read the same twice")
    return image


def finish_image(image: Image.Image, spec: PreprocessSpec, input_shape: tuple[int, ...],
                 kind: str = "PNG") -> npt.NDArray[np.float32]:
    """``[1, *input_shape]``: an opened image (:func:`open_png`, ``server.planning.webp.open_webp``) decoded
    and preprocessed.

    Raises:
        BadRequestError: the stream fails to decode.
    """
    try:
        image.load()
        x = preprocess_image(image, spec)
    except (*PIL_ERRORS, PreprocessError) as exc:
        raise BadRequestError(f"the {kind} image does not decode: {exc}") from exc
    if tuple(x.shape) != tuple(input_shape):  # image_fits agreed; a guard, not a path
        raise BadRequestError(f"the image became {list(x.shape)}, not the model's input {list(input_shape)}")
    return x[None]


def finish_png(image: Image.Image, spec: PreprocessSpec,
               input_shape: tuple[int, ...]) -> npt.NDArray[np.float32]:
    """:func:`finish_image` of a PNG."""
    return finish_image(image, spec, input_shape, "PNG")


def decode_png(body: bytes, spec: PreprocessSpec, input_shape: tuple[int, ...],
               max_pixels: int) -> npt.NDArray[np.float32]:
    """:func:`open_png` then :func:`finish_png`."""
    return finish_png(open_png(body, spec, input_shape, max_pixels), spec, input_shape)


def probe_png(spec: PreprocessSpec, input_shape: tuple[int, ...]) -> bytes | None:
    """A PNG of :func:`probe_image`, or None where there is none."""
    image = probe_image(spec, input_shape)
    if image is None:
        return None
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def probe_image(spec: PreprocessSpec, input_shape: tuple[int, ...]) -> Image.Image | None:
    """An image of noise that the card's preprocessing makes into the model's input at no resize
    (its output size, its color mode), or None if no such image exists (e.g. a resize of the
    shorter side without a crop to square)."""
    if len(input_shape) != 3:
        return None
    h, w = input_shape[1:]
    if image_fits(w, h, spec, input_shape, max_pixels=w * h) is not None:
        return None
    rng = np.random.default_rng(0)
    shape = (h, w) if spec.color == "L" else (h, w, 3)
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), spec.color)


class ImageTimes:
    """Per model version, what decoding and preprocessing an input image costs this server: a
    start-up probe (:func:`decode_seconds`), then the median of the last :attr:`WINDOW` images
    served once :attr:`LEAST` have been. As with the tails' prices, requests decode colder than a
    timing loop does (others ran in between): the probe alone read 0.1 ms where served images took
    0.3 to 1 ms here. Either is per pixel of ``max(pixels, the probe's)``: small images cost what
    the probe's size does, larger ones in proportion."""

    WINDOW = 9
    LEAST = 3
    CLAMP = 16.0  # served images took up to about 10x the probe's time here (0.3 to 1 ms against 0.1)

    def __init__(self) -> None:
        self._probe: dict[tuple[str, str], tuple[float, int]] = {}
        self._seen: dict[tuple[str, str], deque[float]] = {}

    def set_probe(self, key: tuple[str, str], seconds: float, pixels: int) -> None:
        """The start-up figure: ``seconds`` for an image of ``pixels``."""
        self._probe[key] = (seconds, pixels)
        self._seen[key] = deque(maxlen=self.WINDOW)

    def takes_images(self, key: tuple[str, str]) -> bool:
        """Whether the model version was probed (its card's preprocessing makes images its input)."""
        return key in self._probe

    def observe(self, key: tuple[str, str], seconds: float, pixels: int) -> None:
        """A served image of ``pixels`` took ``seconds`` to decode and preprocess; counted at most
        :attr:`CLAMP` times the probe's price per pixel, so that a few slow images (one client's
        costly PNGs) cannot price the image plan out for every device."""
        if key in self._probe:
            probe_s, probe_pixels = self._probe[key]
            unit = seconds / max(pixels, probe_pixels)
            self._seen[key].append(min(unit, self.CLAMP * probe_s / probe_pixels))

    def samples(self, key: tuple[str, str]) -> int:
        """How many served images the price now draws on (at most :attr:`WINDOW`)."""
        return len(self._seen.get(key, ()))

    def predict(self, key: tuple[str, str], pixels: int) -> float | None:
        """Seconds for an image of ``pixels`` (None: the model takes no input image)."""
        if key not in self._probe:
            return None
        seconds, probe_pixels = self._probe[key]
        seen = self._seen[key]
        unit = statistics.median(seen) if len(seen) >= self.LEAST else seconds / probe_pixels
        return unit * max(pixels, probe_pixels)


def decode_seconds(spec: PreprocessSpec, input_shape: tuple[int, ...], max_pixels: int) -> float:
    """This server's time to decode and preprocess :func:`probe_png`'s image (median of
    :data:`PROBE_RUNS`); 0 when there is none."""
    return time_decoding(probe_png(spec, input_shape), lambda b: decode_png(b, spec, input_shape, max_pixels))


def time_decoding(body: bytes | None, decode: Callable[[bytes], object]) -> float:
    """The median of :data:`PROBE_RUNS` timings of ``decode(body)`` (0 for no body)."""
    if body is None:
        return 0.0
    times = []
    for _ in range(PROBE_RUNS):
        start = time.perf_counter()
        decode(body)
        times.append(time.perf_counter() - start)
    return float(np.median(times))
