"""The built-in Fashion-MNIST splits as a data source, and their export to an ImageFolder of PNGs.

The export names each class folder so that torchvision's sorted class order is the label order
(``0``..``9``, or ``0-t-shirt-top``.. with label names), and each file after its index in the IDX
file, so reading it back gives :func:`models.data.load_split`'s tensors in class-major order.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image

from qpart.models.data import Split, data_dir, load_split_pixels
from qpart.models.errors import DatasetError, PreprocessError
from qpart.models.preprocess import FASHION_MNIST_SPEC, PreprocessSpec, normalize_pixels, to_pixels
from qpart.models.sources.base import (
    Batch,
    DataSource,
    Indices,
    SplitRecord,
    check_batch_size,
    check_selection,
    tensor_digests,
)

FASHION_CLASSES = 10
_FILE_DIGITS = 5  # the IDX files hold at most 60,000 images
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def class_folder_names(count: int, label_names: Sequence[str] | None = None) -> tuple[str, ...]:
    """Folder names for ``count`` classes whose sorted order is the label order.

    Zero-padded label numbers (``"0"``..``"9"``, ``"00"``..``"99"``), each followed by ``-`` and its
    label name made file-name safe when ``label_names`` are given (``"0-t-shirt-top"``).
    """
    if label_names is not None and len(label_names) != count:
        raise DatasetError(f"{len(label_names)} label names for {count} classes; give one name per class")
    width = len(str(count - 1))
    if label_names is None:
        return tuple(f"{i:0{width}d}" for i in range(count))
    slugs = [_UNSAFE.sub("-", name).strip("-").lower() for name in label_names]
    return tuple(f"{i:0{width}d}-{slug}" if slug else f"{i:0{width}d}" for i, slug in enumerate(slugs))


class FashionMnistSource(DataSource):
    """One split of the built-in Fashion-MNIST (:func:`models.data.load_split`), as a source.

    Its batches are ``load_split(split, limit)``'s images and labels, bit for bit. With another
    ``spec`` (a model's camera-style preprocessing), each 28×28 grayscale image goes through it as
    a Pillow image, as its PNG export read by :class:`ImageFolderSource` with that spec would.

    Args:
        split: which split.
        limit: only the first ``limit`` samples of the split.
        label_names: class names; default the folder names of :func:`class_folder_names`.
        spec: the preprocessing (default :data:`FASHION_MNIST_SPEC`); it must fix the output shape.
    """

    kind = "fashion-mnist"

    def __init__(self, split: Split, *, limit: int | None = None,
                 label_names: Sequence[str] | None = None, spec: PreprocessSpec | None = None) -> None:
        pixels, labels, indices = load_split_pixels(split, limit)
        super().__init__(class_folder_names(FASHION_CLASSES, label_names), labels, None)
        self._spec = FASHION_MNIST_SPEC if spec is None else spec
        shape = self._spec.output_shape
        if shape is None:
            raise PreprocessError("Fashion-MNIST through a preprocessing needs a fixed output shape; add a "
                                  "center_crop or an [H, W] resize")
        self._shape = shape
        self._split_name = split
        self._pixels = pixels
        self._indices = indices
        self._digests: tuple[str, ...] | None = None

    @property
    def pixels(self) -> npt.NDArray[np.uint8]:
        """uint8 ``[N, 28, 28]``: each sample's image as the IDX file holds it (before the spec)."""
        return self._pixels

    @property
    def source_indices(self) -> Indices:
        """int64 ``[N]``: each sample's index in its IDX file."""
        return self._indices

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return self._shape

    def batches(self, batch_size: int) -> Iterator[Batch]:
        check_batch_size(batch_size)
        for start in range(0, len(self), batch_size):
            stop = min(start + batch_size, len(self))
            if self._spec == FASHION_MNIST_SPEC:
                pixels = self._pixels[start:stop, None]
            else:
                pixels = np.stack([to_pixels(Image.fromarray(image), self._spec)
                                   for image in self._pixels[start:stop]])
            yield Batch(normalize_pixels(pixels, self._spec), self._labels[start:stop].copy())

    def sample_digests(self) -> tuple[str, ...]:
        """sha256 of each sample's float32 little-endian bytes, as :class:`ArraySource` digests them."""
        if self._digests is None:
            self._digests = tuple(d for batch in self.batches(1000) for d in tensor_digests(batch.images))
        return self._digests

    def select(self, indices: Indices, split: SplitRecord | None = None) -> FashionMnistSource:
        idx = check_selection(indices, len(self))
        out = FashionMnistSource.__new__(FashionMnistSource)
        DataSource.__init__(out, self._class_names, self._labels[idx], split)
        out._spec, out._shape = self._spec, self._shape
        out._split_name = self._split_name
        out._pixels = self._pixels[idx]
        out._indices = self._indices[idx]
        out._digests = None if self._digests is None else tuple(self._digests[i] for i in idx.tolist())
        return out

    def _location(self) -> str:
        return f"fashion-mnist:{self._split_name}@{data_dir()}"

    def _preprocess(self) -> PreprocessSpec:
        return self._spec


def export_image_folder(split: Split, out: Path, *, limit: int | None = None,
                        label_names: Sequence[str] | None = None, flat: bool = False) -> int:
    """Write a Fashion-MNIST split as an ImageFolder of 28×28 grayscale PNGs.

    Files are ``out/<class folder>/<index in the IDX file, 5 digits>.png``; class folders as
    :func:`class_folder_names` names them. ``flat``: ``out/<index>.png``, the labels withheld (a
    flat folder, read as unlabelled data).

    Args:
        split: which split.
        out: a folder that does not exist or is empty.
        limit: only the first ``limit`` samples of the split.
        label_names: the ten class names (a model card's labels), else folders are ``0``..``9``.

    Returns:
        The number of files written. Every class folder is made, so a small ``limit`` can leave
        one empty, which an ImageFolder refuses.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DatasetError(f"{out} exists and is not an empty folder; choose a new folder for the export")
    pixels, labels, indices = load_split_pixels(split, limit)
    folders = [""] * FASHION_CLASSES if flat else class_folder_names(FASHION_CLASSES, label_names)
    for name in dict.fromkeys(folders):
        (out / name).mkdir(parents=True, exist_ok=True)
    for image, label, index in zip(pixels, labels.tolist(), indices.tolist(), strict=True):
        Image.fromarray(image).save(out / folders[label] / f"{index:0{_FILE_DIGITS}d}.png", format="PNG")
    return int(labels.shape[0])
