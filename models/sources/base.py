"""The interface every data source implements, and the record an artifact keeps of a source.

A source is an ordered, labelled set of samples that streams in batches. Its order is fixed (the
same on every machine and every run), and so is its content digest: sha256 over its class names
and, in order, each sample's digest and label.
"""

from __future__ import annotations

import copy
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from qpart.models.errors import DatasetError
from qpart.models.preprocess import PreprocessSpec

Images = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int64]
Indices = npt.NDArray[np.int64]

SourceKind = Literal["image-folder", "arrays", "fashion-mnist"]
"""``image-folder``: torchvision's ImageFolder layout, decoded and preprocessed by a spec.
``arrays``: already preprocessed tensors in an ``.npz`` or safetensors file.
``fashion-mnist``: the built-in IDX splits of :mod:`models.data`."""

UNLABELLED = -1
"""The label of every sample of a source without labels (no class names): a flat folder of images,
an array file without ``y``. Only a label-free metric (top1-agreement) can judge it."""
MAX_BATCH = 1 << 16
"""The largest batch size a source streams (a guard against a typo allocating gigabytes)."""
_DIGEST_DOMAIN = b"qpart-source-v1\n"


class Batch(NamedTuple):
    """One batch of a source, in the source's order."""

    images: Images
    """float32 ``[B, C, H, W]``."""
    labels: Labels
    """int64 ``[B]``, indices into the source's class names."""


class SplitRecord(BaseModel):
    """How a source was cut out of a larger one by :func:`models.sources.splits.split_source`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    part: Literal["calibration", "test"] = Field(description="Which side of the split this source is.")
    seed: int = Field(description="Seed of the permutation that chose the test samples.")
    parent_count: int = Field(description="Samples in the source that was split.")
    parent_sha256: str = Field(description="Content digest of the source that was split.")
    count: int = Field(description="Samples on this side.")
    indices_sha256: str = Field(description="sha256 of this side's indices into the parent (int64 LE).")


class SourceRecord(BaseModel):
    """What an artifact records of the data it was calibrated or tested on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: SourceKind = Field(description="The source's format.")
    location: str = Field(description="Where it was read from (a path, or fashion-mnist:<split>).")
    count: int = Field(description="Samples.")
    classes: tuple[str, ...] = Field(description="Class names; a label is an index into them.")
    sample_shape: tuple[int, int, int] = Field(description="(C, H, W) of every sample.")
    content_sha256: str = Field(description="sha256 over the class names, sample digests and labels.")
    preprocess: PreprocessSpec | None = Field(default=None, description="How images became tensors.")
    split: SplitRecord | None = Field(default=None, description="Set when cut from a larger source.")


class DataSource(ABC):
    """An ordered, labelled set of samples, streamed in batches.

    Subclasses give the class names, labels, per-sample digests and batches; the content digest
    and the record follow from them.
    """

    kind: SourceKind

    def __init__(self, class_names: Sequence[str], labels: Labels, split: SplitRecord | None) -> None:
        self._class_names = tuple(class_names)
        self._labels = labels
        self._labels.flags.writeable = False
        self._split = split
        self._content_sha256: str | None = None

    @property
    def class_names(self) -> tuple[str, ...]:
        """Class names in label order (none: the source has no labels)."""
        return self._class_names

    @property
    def labelled(self) -> bool:
        """Whether its samples have labels (an unlabelled source's are all :data:`UNLABELLED`)."""
        return bool(self._class_names)

    @property
    @abstractmethod
    def sample_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of every sample."""

    @property
    def split(self) -> SplitRecord | None:
        """The split this source is one side of, if any."""
        return self._split

    def __len__(self) -> int:
        return int(self._labels.shape[0])

    def labels(self) -> Labels:
        """int64 ``[N]`` labels of every sample in order (read-only)."""
        return self._labels

    @abstractmethod
    def sample_digests(self) -> tuple[str, ...]:
        """sha256 hex digest of each sample in order: of its file for files, of its float32
        little-endian tensor bytes for arrays."""

    @abstractmethod
    def batches(self, batch_size: int) -> Iterator[Batch]:
        """The samples in order, ``batch_size`` at a time (the last batch may be smaller).

        Holds at most a few batches in memory, never the whole source.
        """

    @abstractmethod
    def select(self, indices: Indices, split: SplitRecord | None = None) -> DataSource:
        """The samples at ``indices`` (strictly increasing), as a source of the same kind."""

    @abstractmethod
    def _location(self) -> str: ...

    def _preprocess(self) -> PreprocessSpec | None:
        return None

    def in_class_order(self, class_names: Sequence[str]) -> DataSource:
        """The same samples with the classes renumbered into the order ``class_names`` (the same
        names, reordered): a sample of class ``c`` gets the label ``class_names.index(c)``.

        Raises:
            DatasetError: ``class_names`` are not this source's class names, reordered.
        """
        if sorted(class_names) != sorted(self._class_names) or len(set(class_names)) != len(class_names):
            raise DatasetError(f"classes {list(class_names)} are not {list(self._class_names)} reordered")
        position = {name: i for i, name in enumerate(class_names)}
        renumber = np.array([position[name] for name in self._class_names], dtype=np.int64)
        out = copy.copy(self)  # every subclass reads its labels and names from these two fields
        DataSource.__init__(out, class_names, renumber[self._labels], self._split)
        return out

    def content_sha256(self) -> str:
        """sha256 over the class names, then each sample's digest and label, in order."""
        if self._content_sha256 is None:
            self._content_sha256 = content_digest(self._class_names, self.sample_digests(), self._labels)
        return self._content_sha256

    def describe(self) -> SourceRecord:
        """The record an artifact keeps of this source."""
        return SourceRecord(kind=self.kind, location=self._location(), count=len(self),
                            classes=self._class_names, sample_shape=self.sample_shape,
                            content_sha256=self.content_sha256(), preprocess=self._preprocess(),
                            split=self._split)


def content_digest(class_names: Sequence[str], digests: Sequence[str], labels: Labels) -> str:
    """sha256 hex of the class names, then one ``<digest> <label>`` line per sample."""
    hasher = hashlib.sha256(_DIGEST_DOMAIN)
    for name in class_names:
        hasher.update(f"class {name}\n".encode())
    for digest, label in zip(digests, labels.tolist(), strict=True):
        hasher.update(f"{digest} {label}\n".encode())
    return hasher.hexdigest()


def tensor_digests(images: Images) -> list[str]:
    """sha256 hex of each sample's float32 little-endian bytes, ``images`` float32 ``[B, ...]``."""
    rows = np.ascontiguousarray(images, dtype="<f4")
    return [hashlib.sha256(row.tobytes()).hexdigest() for row in rows]


def check_batch_size(batch_size: int) -> None:
    """Refuse a batch size outside ``1..MAX_BATCH``."""
    if not 1 <= batch_size <= MAX_BATCH:
        raise DatasetError(f"batch size {batch_size} is outside 1..{MAX_BATCH}")


def check_selection(indices: Indices, length: int) -> Indices:
    """``indices`` as int64 if they are strictly increasing positions in ``0..length-1``."""
    idx = np.asarray(indices)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise DatasetError(f"selected indices must be a 1-D integer array, not {idx.dtype} {idx.shape}")
    idx = idx.astype(np.int64)
    if idx.size and (idx[0] < 0 or idx[-1] >= length):
        raise DatasetError(f"selected indices must lie in 0..{length - 1}")
    if idx.size > 1 and not bool((np.diff(idx) > 0).all()):
        raise DatasetError("selected indices must be strictly increasing (a subset keeps the source's order)")
    return idx


def labels_within(labels: npt.NDArray[np.generic], class_count: int, where: str) -> Labels:
    """``labels`` as int64 if every one indexes one of ``class_count`` classes."""
    out = labels.astype(np.int64)
    if out.size and (int(out.min()) < 0 or int(out.max()) >= class_count):
        raise DatasetError(
            f"{where}: labels span {int(out.min())}..{int(out.max())} but there are {class_count} classes; "
            f"labels must be 0..{class_count - 1}")
    return out
