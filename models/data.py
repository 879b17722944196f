"""Fashion-MNIST from IDX files and the project's deterministic, recorded data splits.

The splits are disjoint by construction: ``train`` and ``calibration`` partition the 60,000
official training images by a seeded permutation; ``test`` is the official 10,000 ``t10k``
images, which no fitting or calibration step reads.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
import numpy.typing as npt

from qpart.models.errors import DatasetError

DEFAULT_DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
DATA_DIR_ENV = "QPART_DATA_DIR"
DEBIAN_PACKAGE = "dataset-fashion-mnist"

SPLIT_SEED = 20250630
CALIBRATION_COUNT = 10_000
TRAIN_POOL = 60_000

_IDX_IMAGES_MAGIC = 0x00000803
_IDX_LABELS_MAGIC = 0x00000801
# An IDX file of this dataset never has more than this many items; a header claiming more is hostile.
_MAX_ITEMS = 1_000_000


class Split(StrEnum):
    """The three disjoint data splits."""

    TRAIN = "train"
    """Fitting the reference models only."""
    CALIBRATION = "calibration"
    """Held out of training; noise tables, accuracy mapping and validation of patterns."""
    TEST = "test"
    """The official ``t10k`` images; read once per pattern, by no fitting step."""


@dataclass(frozen=True)
class Dataset:
    """Images as float32 ``[N, 1, 28, 28]`` in ``[0, 1]`` and int64 labels ``[N]``."""

    images: npt.NDArray[np.float32]
    labels: npt.NDArray[np.int64]
    split: Split
    indices_sha256: str

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def data_dir() -> Path:
    """Where the IDX files are read from: ``$QPART_DATA_DIR`` or the Debian package's folder."""
    return Path(os.environ.get(DATA_DIR_ENV, str(DEFAULT_DATA_DIR)))


def _read_gz(path: Path) -> bytes:
    if not path.is_file():
        raise DatasetError(
            f"{path} not found: install the Debian package '{DEBIAN_PACKAGE}' "
            f"(apt-get install {DEBIAN_PACKAGE}) or set {DATA_DIR_ENV} to a folder holding it"
        )
    try:
        with gzip.open(path, "rb") as handle:
            return handle.read()
    except (OSError, EOFError) as exc:
        raise DatasetError(f"{path} is not a readable gzip file: {exc}") from exc


def parse_idx(raw: bytes, *, expect_images: bool) -> npt.NDArray[np.uint8]:
    """Parse an IDX file (big-endian header) of unsigned bytes, checking every size field.

    Args:
        raw: the decompressed file.
        expect_images: ``True`` for a 3-D image file, ``False`` for a 1-D label file.

    Returns:
        uint8 array ``[N, rows, cols]`` or ``[N]``.
    """
    magic = _IDX_IMAGES_MAGIC if expect_images else _IDX_LABELS_MAGIC
    ndim = 3 if expect_images else 1
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DatasetError(f"IDX file is {len(raw)} bytes, shorter than its {header_len}-byte header")
    (found,) = struct.unpack_from(">I", raw, 0)
    if found != magic:
        raise DatasetError(f"IDX magic {found:#010x}, expected {magic:#010x}")
    dims = struct.unpack_from(f">{ndim}I", raw, 4)
    if dims[0] > _MAX_ITEMS or any(d == 0 or d > 4096 for d in dims[1:]):
        raise DatasetError(f"IDX dimensions {dims} are out of range")
    count = int(np.prod(dims, dtype=np.int64))
    if len(raw) != header_len + count:
        raise DatasetError(
            f"IDX payload is {len(raw) - header_len} bytes, header says {count} ({dims})"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_len).reshape(dims)


def _load_pair(prefix: str) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    folder = data_dir()
    images = parse_idx(_read_gz(folder / f"{prefix}-images-idx3-ubyte.gz"), expect_images=True)
    labels = parse_idx(_read_gz(folder / f"{prefix}-labels-idx1-ubyte.gz"), expect_images=False)
    if images.shape[0] != labels.shape[0]:
        raise DatasetError(f"{images.shape[0]} images but {labels.shape[0]} labels in '{prefix}'")
    return images, labels


def split_indices(split: Split) -> npt.NDArray[np.int64]:
    """Indices into the source file of a split (seeded, identical on every machine)."""
    if split is Split.TEST:
        return np.arange(10_000, dtype=np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(TRAIN_POOL).astype(np.int64)
    if split is Split.CALIBRATION:
        return np.sort(order[TRAIN_POOL - CALIBRATION_COUNT :])
    return np.sort(order[: TRAIN_POOL - CALIBRATION_COUNT])


def load_split_pixels(
    split: Split, limit: int | None = None
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """One split as the IDX files hold it: uint8 images ``[N, 28, 28]``, int64 labels ``[N]`` and
    the int64 indices ``[N]`` of the samples in their source file.

    Args:
        split: which split.
        limit: keep only the first ``limit`` samples of the split (in index order).
    """
    images, labels = _load_pair("t10k" if split is Split.TEST else "train")
    idx = split_indices(split)
    if limit is not None:
        idx = idx[:limit]
    return images[idx], labels[idx].astype(np.int64), idx


def load_split(split: Split, limit: int | None = None) -> Dataset:
    """Load one split as float32 images in ``[0, 1]``.

    Args:
        split: which split.
        limit: keep only the first ``limit`` samples of the split (in index order).
    """
    pixels, labels, idx = load_split_pixels(split, limit)
    digest = hashlib.sha256(idx.astype("<i8").tobytes()).hexdigest()
    x = (pixels.astype(np.float32) / np.float32(255.0))[:, None, :, :]
    return Dataset(images=x, labels=labels, split=split, indices_sha256=digest)


def describe_splits() -> dict[str, object]:
    """The record of the splits that artifacts and model cards carry."""
    return {
        "dataset": "fashion-mnist",
        "seed": SPLIT_SEED,
        "train": {"source": "train", "count": TRAIN_POOL - CALIBRATION_COUNT,
                  "indices_sha256": _digest(Split.TRAIN)},
        "calibration": {"source": "train", "count": CALIBRATION_COUNT,
                        "indices_sha256": _digest(Split.CALIBRATION)},
        "test": {"source": "t10k", "count": 10_000, "indices_sha256": _digest(Split.TEST)},
    }


def _digest(split: Split) -> str:
    return hashlib.sha256(split_indices(split).astype("<i8").tobytes()).hexdigest()
