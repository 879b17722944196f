"""One source split into calibration and test by a seeded permutation, and the checks that a
calibration source and a test source may be used together."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from qpart.models.errors import DatasetError, SampleOverlapError, SourceMismatchError
from qpart.models.sources.base import DataSource, Indices, SplitRecord


@dataclass(frozen=True)
class SourceSplit:
    """The two sides of :func:`split_source`; each keeps the parent's order and class names."""

    calibration: DataSource
    test: DataSource


def split_indices(count: int, test_count: int, seed: int) -> tuple[Indices, Indices]:
    """Sorted calibration and test indices into ``count`` samples: the first ``test_count`` of a
    permutation drawn with ``numpy.random.default_rng(seed)`` are the test samples."""
    if not 0 < test_count < count:
        raise DatasetError(f"test count {test_count} must be between 1 and {count - 1} for {count} samples")
    order = np.random.default_rng(seed).permutation(count).astype(np.int64)
    return np.sort(order[test_count:]), np.sort(order[:test_count])


def _indices_sha256(indices: Indices) -> str:
    return hashlib.sha256(indices.astype("<i8").tobytes()).hexdigest()


def split_source(source: DataSource, *, test_count: int, seed: int) -> SourceSplit:
    """Split one source into calibration and test samples, reproducibly.

    Each side records the seed, the parent's count and digest, its own count and the sha256 of
    its indices (:attr:`DataSource.split`, :meth:`DataSource.describe`).

    Args:
        source: the source to split.
        test_count: samples that go to the test side.
        seed: seed of the permutation.
    """
    calibration, test = split_indices(len(source), test_count, seed)
    parent = source.content_sha256()

    def record(part: str, indices: Indices) -> SplitRecord:
        return SplitRecord.model_validate({
            "part": part, "seed": seed, "parent_count": len(source), "parent_sha256": parent,
            "count": int(indices.shape[0]), "indices_sha256": _indices_sha256(indices)})

    return SourceSplit(calibration=source.select(calibration, record("calibration", calibration)),
                       test=source.select(test, record("test", test)))


def check_sources(calibration: DataSource, test: DataSource) -> None:
    """Refuse a calibration and a test source that cannot be used together.

    Raises:
        SourceMismatchError: their class names differ (as sets, or in order).
        SampleOverlapError: they share a sample (an equal file or tensor digest).
    """
    cal_classes, test_classes = calibration.class_names, test.class_names
    if calibration.labelled and test.labelled and cal_classes != test_classes:
        only_cal = sorted(set(cal_classes) - set(test_classes))
        only_test = sorted(set(test_classes) - set(cal_classes))
        if only_cal or only_test:
            raise SourceMismatchError(
                f"calibration and test sources have different classes (only in calibration: "
                f"{_shown(only_cal)}; only in test: {_shown(only_test)}); give both the same class folders")
        raise SourceMismatchError("calibration and test sources order their classes differently; "
                                  "give both the same class names in the same order")
    if calibration.sample_shape != test.sample_shape:
        raise SourceMismatchError(f"calibration samples are {calibration.sample_shape} but test samples are "
                                  f"{test.sample_shape}; preprocess both the same way")
    cal_digests = set(calibration.sample_digests())
    shared = [i for i, d in enumerate(test.sample_digests()) if d in cal_digests]
    if shared:
        raise SampleOverlapError(
            f"{len(shared)} test sample{'s are' if len(shared) > 1 else ' is'} also in the calibration "
            f"source (first: test sample {shared[0]}, {_describe_sample(test, shared[0])}); remove the "
            f"duplicates from one side")


def _shown(names: list[str]) -> str:
    if not names:
        return "none"
    return ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _describe_sample(source: DataSource, index: int) -> str:
    files = getattr(source, "files", None)
    if isinstance(files, tuple) and index < len(files):
        return f"file {files[index]}"
    return f"sha256 {source.sample_digests()[index][:16]}…"
