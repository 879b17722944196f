"""Reading device inputs: IDX image files (gzip or raw) as float32 in [0, 1], image files
preprocessed as a model card declares, and labels (IDX1, .npy or text)."""

from __future__ import annotations

import gzip
import io
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image

from qpart.client.errors import DeviceInputError
from qpart.models.data import parse_idx
from qpart.models.errors import DatasetError, ImageCodecError, PreprocessError
from qpart.models.image_codecs import encode_webp
from qpart.models.preprocess import PreprocessSpec, preprocess_image

MAX_INPUT_BYTES = 512 << 20
_UNREADABLE = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)
"""What Pillow raises on a file that is not a readable image: OSError (UnidentifiedImageError is
one), SyntaxError and ValueError from its plugins' header parsers, DecompressionBombError."""


def _read(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            with gzip.open(path, "rb") as handle:
                raw = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise DeviceInputError(f"cannot read {path}: {exc}") from exc
    if len(raw) > MAX_INPUT_BYTES:
        raise DeviceInputError(f"{path} is larger than {MAX_INPUT_BYTES} bytes")
    return raw


def read_idx_images(path: Path, limit: int | None = None) -> npt.NDArray[np.float32]:
    """``[N, 1, rows, cols]`` float32 in [0, 1] from an IDX3 file."""
    try:
        images = parse_idx(_read(path), expect_images=True)
    except DatasetError as exc:
        raise DeviceInputError(f"{path}: {exc}") from exc
    images = images[:limit] if limit else images
    return (images.astype(np.float32) / np.float32(255.0))[:, None]


def read_idx_labels(path: Path, limit: int | None = None) -> npt.NDArray[np.int64]:
    """``[N]`` labels from an IDX1 file."""
    try:
        labels = parse_idx(_read(path), expect_images=False)
    except DatasetError as exc:
        raise DeviceInputError(f"{path}: {exc}") from exc
    return (labels[:limit] if limit else labels).astype(np.int64)


def read_labels(path: Path, limit: int | None = None) -> npt.NDArray[np.int64]:
    """``[N]`` class indices from an IDX1 file (gzip or raw), a ``.npy`` file of one integer array
    (read without pickle), or a text file of one integer a line (blank lines and ``#`` comments
    skipped), told apart by their first bytes.

    Raises:
        DeviceInputError: naming the file and what is wrong with it.
    """
    raw = _read(path)
    if raw[:6] == b"\x93NUMPY":
        try:
            array = np.load(io.BytesIO(raw), allow_pickle=False)
        except ValueError as exc:
            raise DeviceInputError(f"{path}: not a .npy array of integers ({exc})") from exc
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise DeviceInputError(f"{path}: labels must be a 1-D integer array, not {array.dtype} "
                                   f"of shape {array.shape}")
        labels: npt.NDArray[np.int64] = array.astype(np.int64)
    elif raw[:4] == b"\x00\x00\x08\x01":  # IDX1: unsigned bytes, one dimension
        return read_idx_labels(path, limit)
    else:
        labels = _text_labels(path, raw)
    return labels[:limit] if limit else labels


def _text_labels(path: Path, raw: bytes) -> npt.NDArray[np.int64]:
    """One integer a line."""
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DeviceInputError(f"{path}: not IDX1, .npy or text labels") from exc
    out: list[int] = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if not text.lstrip("-").isdigit() or int(text) < 0:
            raise DeviceInputError(f"{path} line {number}: {text[:40]!r} is not a class index "
                                   "(one non-negative integer a line)")
        out.append(int(text))
    return np.asarray(out, np.int64)


def check_image_files(paths: list[Path]) -> None:
    """Refuse, before any network use, a file that is missing or not an image (a header check and
    Pillow's ``verify``, without decoding the pixels).

    Raises:
        DeviceInputError: naming the first such file.
    """
    for path in paths:
        try:
            with Image.open(path) as img:
                img.verify()
        except _UNREADABLE as exc:
            raise DeviceInputError(f"{path} is not a readable image: {exc}") from exc


_PNG_MODES = ("1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA")
"""Pillow modes a PNG may hold as they are (mode I only where its values fit 16 bits); any other
(CMYK, YCbCr ...) is stored as RGB, and offered only where that gives the same model input."""


def png_of_file(path: Path, spec: PreprocessSpec,
                model_input: npt.NDArray[np.float32]) -> tuple[bytes, int, int, float] | None:
    """The image in ``path`` as a PNG (lossless, before any preprocessing: ADR 0014's input-image
    plan), its width and height, and the seconds encoding it took on this device; None where no PNG
    of it gives the server ``model_input`` (what ``spec`` makes of the file here): a mode PNG
    cannot store (32-bit integer or float pixels), or one whose conversion to RGB moves a value
    (YCbCr, CMYK). The device then sends what a plan says of ``model_input`` instead.

    Raises:
        DeviceInputError: the file is not a readable image.
    """
    try:
        with Image.open(path) as img:
            img.load()
            image = img.copy() if img.mode in _PNG_MODES else img.convert("RGB")  # outlives the file
            # none of the file's metadata (an ICC profile, EXIF, text): the preprocessing ignores it,
            # it would be priced as upload bytes, and the server caps text chunks at 64 KiB (a 200 KB
            # profile made an offer the server refused: review)
            image.info = {k: v for k, v in image.info.items() if k == "transparency"}
    except _UNREADABLE as exc:
        raise DeviceInputError(f"{path} is not a readable image: {exc}") from exc
    try:
        # The first PNG a process writes pays for loading the encoder (3.5 ms against 0.13 ms for
        # a 28x28 image on this host): a 1x1 image pays it, untimed.
        image.resize((1, 1)).save(io.BytesIO(), "PNG")
        start = time.perf_counter()
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        seconds = time.perf_counter() - start
    except (OSError, ValueError):  # readable, but Pillow cannot write it as a PNG (mode I, F)
        return None
    png = buffer.getvalue()
    try:
        with Image.open(io.BytesIO(png), formats=["PNG"]) as back:
            same = np.array_equal(preprocess_image(back, spec), model_input)
    except (PreprocessError, *_UNREADABLE):
        same = False
    return (png, image.width, image.height, seconds) if same else None


def read_image_files(paths: list[Path], spec: PreprocessSpec) -> npt.NDArray[np.float32]:
    """``[N, C, H, W]`` float32: each image converted, resized, cropped and normalized by ``spec``
    (an RGB photo for a grayscale model becomes its luma, as the spec's color mode declares).

    Raises:
        DeviceInputError: a file is not a readable image, or the images come out in different
            shapes (a spec that resizes the shorter side without a crop keeps the aspect ratio).
    """
    if not paths:
        raise DeviceInputError("no image files given")
    out = []
    for path in paths:
        try:
            with Image.open(path) as img:
                out.append(preprocess_image(img, spec))
        except PreprocessError as exc:  # a readable image the spec cannot take (smaller than the crop)
            raise DeviceInputError(f"{path}: {exc}") from exc
        except _UNREADABLE as exc:
            raise DeviceInputError(f"{path} is not a readable image: {exc}") from exc
    shapes = {a.shape for a in out}
    if len(shapes) > 1:
        raise DeviceInputError(f"the images preprocess to different shapes {sorted(shapes)}: the model's "
                               f"preprocessing resizes without a center crop, so send images of one size")
    return np.stack(out).astype(np.float32, copy=False)


def webp_of_file(path: Path, quality: int) -> tuple[bytes, float] | None:
    """The image in ``path`` as a lossy WebP at ``quality``, by the encoder the calibration measured
    (:func:`qpart.models.image_codecs.encode_webp`: ADR 0015), and the seconds encoding took here
    (its conversion to RGB included, as calibration's encoding includes it); None where WebP cannot
    hold the image (a side over 16,383 pixels): the device then offers no WebP.

    Raises:
        DeviceInputError: the file is not a readable image.
    """
    try:
        with Image.open(path) as img:
            img.load()
            image = img.copy()
    except _UNREADABLE as exc:
        raise DeviceInputError(f"{path} is not a readable image: {exc}") from exc
    try:
        encode_webp(image.resize((1, 1)), quality)  # the first WebP a process writes loads the encoder
        start = time.perf_counter()
        body = encode_webp(image, quality)
    except ImageCodecError:
        return None
    return body, time.perf_counter() - start
