"""A seeded split of one source, and the refusals of calibration/test pairs whose classes differ or
that share a sample."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

from qpart.models.data import Split
from qpart.models.errors import DatasetError, SampleOverlapError, SourceMismatchError
from qpart.models.preprocess import PreprocessSpec
from qpart.models.sources import (
    ArraySource,
    FashionMnistSource,
    ImageFolderSource,
    check_sources,
    split_source,
)
from qpart.models.sources.splits import split_indices
from tests.models.sources.conftest import SPEC, write_image


@pytest.fixture
def arrays(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((30, 1, 2, 2)).astype(np.float32)
    y = (np.arange(30) % 3).astype(np.int64)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    return ArraySource(tmp_path / "d.npz"), x, y


def test_a_seeded_split_is_reproducible_disjoint_and_complete(arrays):
    source, x, _ = arrays
    first = split_source(source, test_count=8, seed=7)
    again = split_source(source, test_count=8, seed=7)
    other = split_source(source, test_count=8, seed=8)
    assert len(first.calibration) == 22 and len(first.test) == 8
    assert first.test.sample_digests() == again.test.sample_digests()
    assert first.test.sample_digests() != other.test.sample_digests()
    cal, test = split_indices(30, 8, 7)
    assert not set(cal.tolist()) & set(test.tolist()) and sorted([*cal, *test]) == list(range(30))
    assert (np.diff(cal) > 0).all() and (np.diff(test) > 0).all()  # each side keeps the source's order
    images = np.concatenate([b.images for b in first.test.batches(3)])
    assert images.tobytes() == x[test].tobytes()
    check_sources(first.calibration, first.test)


def test_the_split_is_recorded_with_seed_counts_and_parent(arrays):
    source, _, _ = arrays
    parts = split_source(source, test_count=8, seed=7)
    record = parts.test.describe()
    assert record.count == 8 and record.split is not None
    assert record.split.part == "test" and record.split.seed == 7 and record.split.count == 8
    assert record.split.parent_count == 30 and record.split.parent_sha256 == source.content_sha256()
    cal_record = parts.calibration.describe().split
    assert cal_record is not None and cal_record.part == "calibration" and cal_record.count == 22
    assert cal_record.indices_sha256 != record.split.indices_sha256
    assert record.content_sha256 != source.content_sha256()


@pytest.mark.parametrize("count", [0, 30, -1, 31])
def test_a_split_needs_samples_on_both_sides(arrays, count):
    with pytest.raises(DatasetError, match="test count"):
        split_source(arrays[0], test_count=count, seed=0)


def test_an_image_folder_split_keeps_files_and_passes_the_checks(tmp_path):
    for i in range(12):
        write_image(tmp_path / "imgs" / ("ab"[i % 2]) / f"{i:02d}.png", i)
    source = ImageFolderSource(tmp_path / "imgs", SPEC)
    parts = split_source(source, test_count=4, seed=1)
    assert isinstance(parts.test, ImageFolderSource)
    assert set(parts.test.files).isdisjoint(parts.calibration.files)  # type: ignore[attr-defined]
    check_sources(parts.calibration, parts.test)


def test_class_sets_that_differ_are_refused(tmp_path):
    for seed, name in enumerate(("cat", "dog")):
        write_image(tmp_path / "cal" / name / "1.png", seed)
    for seed, name in enumerate(("cat", "emu")):
        write_image(tmp_path / "test" / name / "2.png", 10 + seed)
    with pytest.raises(SourceMismatchError, match=r"only in calibration: 'dog'; only in test: 'emu'\); "
                                                  r"give both the same class folders") as err:
        check_sources(ImageFolderSource(tmp_path / "cal", SPEC), ImageFolderSource(tmp_path / "test", SPEC))
    assert "\n" not in str(err.value)


def test_classes_in_another_order_are_refused(tmp_path):
    x = np.zeros((2, 1, 1, 1), np.float32)
    save_file({"x": x, "y": np.array([0, 1])}, str(tmp_path / "a.safetensors"))
    save_file({"x": x + 1, "y": np.array([0, 1])}, str(tmp_path / "b.safetensors"))
    cal = ArraySource(tmp_path / "a.safetensors", class_names=["a", "b"])
    test = ArraySource(tmp_path / "b.safetensors", class_names=["b", "a"])
    with pytest.raises(SourceMismatchError, match="order their classes differently"):
        check_sources(cal, test)


def test_different_sample_shapes_are_refused(tmp_path):
    write_image(tmp_path / "a" / "c" / "1.png", 1)
    write_image(tmp_path / "b" / "c" / "1.png", 2)
    small = PreprocessSpec(color="RGB", resize=(4, 4), mean=(0, 0, 0), std=(1, 1, 1))
    with pytest.raises(SourceMismatchError, match=r"calibration samples are \(3, 8, 8\) but test samples"):
        check_sources(ImageFolderSource(tmp_path / "a", SPEC), ImageFolderSource(tmp_path / "b", small))


def test_a_file_in_both_calibration_and_test_is_refused_naming_it(tmp_path):
    for i in range(4):
        write_image(tmp_path / "cal" / "c" / f"{i}.png", i)
        write_image(tmp_path / "test" / "c" / f"t{i}.png", 10 + i)
    shutil.copy(tmp_path / "cal" / "c" / "2.png", tmp_path / "test" / "c" / "t9.png")  # renamed, same bytes
    cal, test = ImageFolderSource(tmp_path / "cal", SPEC), ImageFolderSource(tmp_path / "test", SPEC)
    with pytest.raises(SampleOverlapError, match=r"1 test sample is also in the calibration source "
                                                 r"\(first: test sample 4, file c/t9.png\)") as err:
        check_sources(cal, test)
    assert "\n" not in str(err.value)


def test_duplicated_files_that_a_split_separates_are_refused(tmp_path):
    for i in range(10):
        write_image(tmp_path / "imgs" / "c" / f"{i}.png", 0)  # ten copies of one image
    parts = split_source(ImageFolderSource(tmp_path / "imgs", SPEC), test_count=3, seed=0)
    with pytest.raises(SampleOverlapError, match="3 test samples are also in the calibration source"):
        check_sources(parts.calibration, parts.test)


def test_equal_tensors_overlap_across_source_kinds(tmp_path):
    fashion = FashionMnistSource(Split.TEST, limit=20)
    images = np.concatenate([b.images for b in fashion.batches(20)])
    np.savez(tmp_path / "copy.npz", x=images[5:8], y=fashion.labels()[5:8],
             classes=np.array(fashion.class_names))
    with pytest.raises(SampleOverlapError, match="3 test samples"):
        check_sources(fashion, ArraySource(tmp_path / "copy.npz"))


def test_the_builtin_calibration_and_test_splits_pass_the_checks():
    calibration = FashionMnistSource(Split.CALIBRATION, limit=3000)
    check_sources(calibration, FashionMnistSource(Split.TEST, limit=3000))
