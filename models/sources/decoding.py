"""Decoding image files to 8-bit pixels, in process or in a bounded pool of worker processes.

Workers return uint8 pixels (a quarter of the float32 bytes); the parent applies the pixel table
(:func:`models.preprocess.normalize_pixels`), so both paths give the same tensors bit for bit.
"""

from __future__ import annotations

import io
import multiprocessing
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import numpy.typing as npt
from PIL import Image

from qpart.models.errors import DatasetError, ImageDecodeError, PreprocessError
from qpart.models.preprocess import PreprocessSpec, to_pixels
from qpart.models.sources.files import read_regular

IMAGE_FORMATS = ("JPEG", "PNG", "WEBP")
"""The only decoders Pillow may use: a file in another format is refused, whatever its name."""
MAX_IMAGE_PIXELS = 1 << 26
"""The most pixels a file may declare (about 8192×8192); larger ones are refused before decoding."""
MAX_WORKERS = 64

Pixels = npt.NDArray[np.uint8]


def decode_pixels(path: str, spec: PreprocessSpec, root: str | None = None) -> Pixels:
    """One image file as uint8 ``[C, H, W]`` pixels after the spec's color, resize and crop.

    Raises:
        ImageDecodeError: the file cannot be read, is not a regular file of at most
            :data:`~qpart.models.sources.files.MAX_FILE_BYTES`, is not a JPEG/PNG/WebP image, is
            truncated or declares more than :data:`MAX_IMAGE_PIXELS` pixels; names the file.
        PreprocessError: the image does not fit the spec (smaller than the crop); names the file.
    """
    try:
        # Read whole by read_regular, not opened by Pillow: a FIFO or device must not block it.
        with Image.open(io.BytesIO(read_regular(path, root=root)), formats=IMAGE_FORMATS) as img:
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ImageDecodeError(
                    f"{path} declares {width}x{height} pixels, more than {MAX_IMAGE_PIXELS}; "
                    f"downscale or remove it")
            img.load()
            return to_pixels(img, spec)
    except PreprocessError as exc:
        raise PreprocessError(f"{path}: {exc}") from exc
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as exc:
        # UnidentifiedImageError is an OSError; a truncated JPEG or PNG raises OSError or
        # SyntaxError; a header declaring gigapixels raises DecompressionBombError.
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ImageDecodeError(
            f"{path} is not a readable JPEG, PNG or WebP image ({reason}); replace or remove it") from exc


def decode_chunk(paths: Sequence[str], spec: PreprocessSpec, root: str | None = None) -> Pixels:
    """Consecutive files as uint8 ``[n, C, H, W]`` (``spec.output_shape`` must be fixed)."""
    shape = spec.output_shape
    if shape is None:
        raise PreprocessError(
            "the preprocessing has no fixed output shape; add a center_crop or an [H, W] resize")
    out = np.empty((len(paths), *shape), dtype=np.uint8)
    for i, path in enumerate(paths):
        pixels = decode_pixels(path, spec, root)
        if pixels.shape != shape:  # cannot happen with a fixed output shape; guards a Pillow surprise
            raise ImageDecodeError(f"{path} decoded to {pixels.shape}, expected {shape}")
        out[i] = pixels
    return out


def iter_pixel_chunks(chunks: Sequence[Sequence[str]], spec: PreprocessSpec, *, workers: int,
                      prefetch: int, root: str | None = None) -> Generator[Pixels, None, None]:
    """Each chunk of files decoded by :func:`decode_chunk`, in order.

    Args:
        chunks: file paths, chunk by chunk.
        spec: the preprocessing.
        root: when given, a file whose real path (once opened) is outside it is refused.
        workers: 0 decodes in this process; more starts that many spawned worker processes.
        prefetch: chunks decoding or decoded but not yet consumed, at most (bounds memory).

    Raises:
        ImageDecodeError: from the first file that fails, in order; the pool is shut down.
        DatasetError: a worker process died (killed for memory, say).
    """
    if not 0 <= workers <= MAX_WORKERS:
        raise DatasetError(f"decoding workers {workers} is outside 0..{MAX_WORKERS}")
    if workers == 0:
        for chunk in chunks:
            yield decode_chunk(chunk, spec, root)
        return
    if prefetch < 1:
        raise DatasetError(f"prefetch {prefetch} must be at least 1")
    # spawn, not fork: the parent may hold torch's thread pools, which a forked child inherits broken.
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    pending: deque[Future[Pixels]] = deque()
    todo = iter(chunks)
    try:
        for chunk in todo:
            pending.append(pool.submit(decode_chunk, chunk, spec, root))
            if len(pending) >= prefetch:
                break
        while pending:
            try:
                pixels = pending.popleft().result()
            except BrokenProcessPool as exc:
                raise DatasetError(
                    f"an image decoding worker died ({exc}); use fewer workers or free memory") from exc
            following = next(todo, None)
            if following is not None:
                pending.append(pool.submit(decode_chunk, following, spec, root))
            yield pixels
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
