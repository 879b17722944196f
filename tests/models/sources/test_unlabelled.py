"""Sources without labels (issue 49): a flat folder of images, an array file without ``y``; each
sample's label is UNLABELLED and the source has no classes, and a calibration and a test source
may differ in having labels."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

from qpart.models.errors import ArrayFileError, ImageFolderError
from qpart.models.sources import ArraySource, ImageFolderSource, check_sources
from qpart.models.sources.base import UNLABELLED
from tests.models.sources.conftest import SPEC, write_image


def test_a_flat_folder_of_images_is_an_unlabelled_source_in_name_order(tmp_path):
    for i, name in enumerate(["b.png", "a.JPG", "c.webp"]):
        write_image(tmp_path / name, i, fmt={"png": "PNG", "JPG": "JPEG", "webp": "WEBP"}[name.split(".")[1]])
    (tmp_path / "notes.txt").write_text("not an image")
    source = ImageFolderSource(tmp_path, SPEC)
    assert not source.labelled and source.class_names == () and source.files == ("a.JPG", "b.png", "c.webp")
    assert source.labels().tolist() == [UNLABELLED] * 3
    batch = next(source.batches(3))
    assert batch.images.shape == (3, 3, 8, 8) and batch.labels.tolist() == [UNLABELLED] * 3
    record = source.describe()
    assert record.classes == () and record.count == 3


def test_a_folder_with_class_folders_stays_labelled(folder):
    source = ImageFolderSource(folder, SPEC)
    assert source.labelled and source.class_names == ("cat", "dog") and len(source) == 5


def test_images_beside_class_folders_are_refused_not_skipped(folder):
    write_image(folder / "stray.png", 9)
    with pytest.raises(ImageFolderError, match=r"holds both images \(1, e.g. 'stray.png'\) and subfolders "
                                               r"\(2, e.g. 'cat'\): put every image in a class folder"):
        ImageFolderSource(folder, SPEC)


def test_a_folder_with_neither_says_both_layouts(tmp_path):
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(ImageFolderError, match=r"neither class folders nor images.*without labels"):
        ImageFolderSource(tmp_path, SPEC)


def test_an_array_file_without_y_is_unlabelled(tmp_path):
    x = np.random.default_rng(0).random((4, 1, 2, 2), dtype=np.float32)
    np.savez(tmp_path / "a.npz", x=x)
    save_file({"x": x}, str(tmp_path / "a.safetensors"))
    for name in ("a.npz", "a.safetensors"):
        source = ArraySource(tmp_path / name)
        assert not source.labelled and source.labels().tolist() == [UNLABELLED] * 4
        assert np.array_equal(next(source.batches(4)).images, x)
    with pytest.raises(ArrayFileError, match="has no labels"):
        ArraySource(tmp_path / "a.npz", class_names=["a", "b"])


def test_an_unlabelled_source_checks_against_a_labelled_one(tmp_path):
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "cal.npz", x=rng.random((4, 1, 2, 2), dtype=np.float32))
    np.savez(tmp_path / "test.npz", x=rng.random((3, 1, 2, 2), dtype=np.float32), y=np.array([0, 1, 1]))
    check_sources(ArraySource(tmp_path / "cal.npz"), ArraySource(tmp_path / "test.npz"))
