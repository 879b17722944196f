"""Reading device inputs: IDX image/label files (gzip or raw) and image files, as float32 in [0, 1]."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import numpy.typing as npt

from qpart.client.errors import DeviceInputError
from qpart.models.data import parse_idx
from qpart.models.errors import DatasetError

MAX_INPUT_BYTES = 512 << 20


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


def read_image_files(paths: list[Path], size: tuple[int, int] = (28, 28)) -> npt.NDArray[np.float32]:
    """Gray-scale images resized to ``size``, ``[N, 1, H, W]`` float32 in [0, 1]."""
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415 (only for image files)

    out = []
    for path in paths:
        try:
            with Image.open(path) as img:
                gray = img.convert("L").resize(size)
                out.append(np.asarray(gray, dtype=np.float32) / 255.0)
        except (OSError, UnidentifiedImageError) as exc:
            raise DeviceInputError(f"{path} is not a readable image: {exc}") from exc
    return np.stack(out)[:, None].astype(np.float32)
