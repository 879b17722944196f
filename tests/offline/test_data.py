"""The job's data sources: named by the settings, checked against each other and the model, and read
in the sample order (issue 24, second layer)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from qpart.models.data import Split, load_split
from qpart.models.errors import LabelsError, SampleOverlapError, SourceMismatchError
from qpart.models.registry import get_model
from qpart.models.sources import ArraySource, FashionMnistSource, ImageFolderSource, export_image_folder
from qpart.offline.data import check_model_fits, open_sources
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.samples import read_samples
from qpart.offline.settings import CalibrationSettings

CNN = get_model("fmnist-cnn")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    """The first 300 calibration and 200 test samples of Fashion-MNIST as ImageFolders of PNGs."""
    root = tmp_path_factory.mktemp("export")
    export_image_folder(Split.CALIBRATION, root / "cal", limit=300)
    export_image_folder(Split.TEST, root / "test", limit=200)
    return root / "cal", root / "test"


def settings(**changes) -> CalibrationSettings:
    return CalibrationSettings(**changes)


def test_the_default_data_is_the_calibration_and_test_splits_read_as_today():
    sources = open_sources(CNN, settings())
    assert sources.order == "source"
    assert [s.describe().location.split("@")[0] for s in (sources.calibration, sources.test)] == [
        "fashion-mnist:calibration", "fashion-mnist:test"]
    got = read_samples(sources.calibration, 1500, sources.order, Split.CALIBRATION)
    expected = load_split(Split.CALIBRATION, limit=1500)
    assert got.images.tobytes() == expected.images.tobytes()
    assert got.labels.tolist() == expected.labels.tolist()
    test = read_samples(sources.test, None, sources.order, Split.TEST)
    assert len(test) == 10_000 and test.images[:200].tobytes() == load_split(Split.TEST, 200).images.tobytes()


def test_digest_order_takes_the_same_samples_from_an_image_folder_as_from_idx(exported):
    """The export is class-major, IDX is not: in digest order both give the same samples."""
    cal, _ = exported
    folder = ImageFolderSource(cal, CNN.preprocess)
    idx = FashionMnistSource(Split.CALIBRATION, limit=300)
    assert folder.labels().tolist() != idx.labels().tolist()  # the orders differ
    a = read_samples(folder, 250, "digest", Split.CALIBRATION)
    b = read_samples(idx, 250, "digest", Split.CALIBRATION)
    assert a.images.tobytes() == b.images.tobytes() and a.labels.tolist() == b.labels.tolist()
    assert a.indices_sha256 != b.indices_sha256  # the positions in each source differ
    assert not np.array_equal(a.labels, idx.labels()[:250])  # and the order is not the source's


def test_a_folder_is_preprocessed_by_the_card_and_defaults_to_digest_order(exported):
    cal, test = exported
    sources = open_sources(CNN, settings(data=str(cal), test_data=str(test)))
    assert sources.order == "digest" and sources.calibration.describe().preprocess == CNN.preprocess
    assert open_sources(CNN, settings(data=str(cal), test_data=str(test), sample_order="source")).order == \
        "source"


def test_one_source_split_by_a_seeded_fraction(exported):
    cal, _ = exported
    a = open_sources(CNN, settings(data=str(cal), test_fraction=0.25, split_seed=7))
    b = open_sources(CNN, settings(data=str(cal), test_fraction=0.25, split_seed=7))
    assert (len(a.calibration), len(a.test)) == (225, 75)
    assert a.test.describe() == b.test.describe() and a.test.describe().split.seed == 7
    assert not set(a.calibration.sample_digests()) & set(a.test.sample_digests())


def test_calibration_and_test_sharing_a_file_are_refused(exported, tmp_path):
    cal, _ = exported
    other = tmp_path / "test"
    shutil.copytree(cal, other)
    with pytest.raises(SampleOverlapError, match="also in the calibration source"):
        open_sources(CNN, settings(data=str(cal), test_data=str(other)))


def test_class_sets_that_differ_are_refused(exported, tmp_path):
    cal, test = exported
    fewer = tmp_path / "test"
    shutil.copytree(test, fewer)
    shutil.rmtree(fewer / "9")
    with pytest.raises(SourceMismatchError, match=r"only in calibration: '9'"):
        open_sources(CNN, settings(data=str(cal), test_data=str(fewer)))


def test_data_whose_classes_are_not_one_per_logit_is_refused(exported, tmp_path):
    cal, test = exported
    for name, source in (("cal", cal), ("test", test)):
        shutil.copytree(source, tmp_path / name, ignore=lambda d, names: [n for n in names if n in "56789"])
    sources = open_sources(CNN, settings(data=str(tmp_path / "cal"), test_data=str(tmp_path / "test")))
    with pytest.raises(LabelsError, match="the data has 5 classes but 'fmnist-cnn' gives 10 logits"):
        check_model_fits(CNN, sources, 10)
    check_model_fits(CNN, sources, 10, "top1-agreement")  # a label-free metric ignores the classes


def test_a_card_whose_labels_are_not_one_per_logit_is_refused():
    sources = open_sources(CNN, settings())
    three = replace(CNN, card={**CNN.card, "labels": ["a", "b", "c"]})
    with pytest.raises(LabelsError, match="names 3 labels but the model gives 10 logits"):
        check_model_fits(three, sources, 10)
    check_model_fits(CNN, sources, 10)


def test_samples_the_model_does_not_take_are_refused(tmp_path):
    path = tmp_path / "rgb.npz"
    np.savez(path, x=np.zeros((20, 3, 8, 8), np.float32), y=np.arange(20) % 10)
    other = tmp_path / "other.npz"
    np.savez(other, x=np.ones((20, 3, 8, 8), np.float32), y=np.arange(20) % 10)
    sources = open_sources(CNN, settings(data=str(path), test_data=str(other)))
    assert isinstance(sources.calibration, ArraySource)
    with pytest.raises(SourceMismatchError, match=r"are \[3, 8, 8\] but 'fmnist-cnn' takes \[1, 28, 28\]"):
        check_model_fits(CNN, sources, 10)


@pytest.mark.parametrize(("changes", "message"), [
    pytest.param({"data": "imagenet"}, "neither fashion-mnist, an existing folder", id="unknown-name"),
    pytest.param({"data": "fashion-mnist:valid"}, "splits are train, calibration, test", id="unknown-split"),
    pytest.param({"data": "missing.npz"}, "neither fashion-mnist", id="missing-file"),
    pytest.param({"test_data": "fashion-mnist", "test_fraction": 0.2}, "not both", id="both-test-ways"),
])
def test_sources_that_cannot_be_opened_are_configuration_errors(changes, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CalibrationConfigError, match=message):
        open_sources(CNN, settings(**changes))


def test_a_folder_without_a_test_source_asks_for_one(exported):
    cal, _ = exported
    with pytest.raises(CalibrationConfigError, match="--test-data SOURCE, or --test-fraction"):
        open_sources(CNN, settings(data=str(cal)))


def test_a_folder_for_a_model_without_preprocessing_is_refused(exported):
    cal, test = exported
    bare = replace(CNN, card={})
    with pytest.raises(CalibrationConfigError, match="declares no preprocessing"):
        open_sources(bare, settings(data=str(cal), test_data=str(test)))


def test_fashion_mnist_through_a_camera_style_card_matches_its_png_export(exported):
    """fmnist-mobilenet's card (RGB, 64x64, mean/std) applied to IDX pixels and to the PNGs."""
    cal, _ = exported
    spec = get_model("fmnist-mobilenet").preprocess
    idx = FashionMnistSource(Split.CALIBRATION, limit=300, spec=spec)
    a = read_samples(idx, 100, "digest", Split.CALIBRATION)
    b = read_samples(ImageFolderSource(cal, spec), 100, "digest", Split.CALIBRATION)
    assert a.images.shape == (100, 3, 64, 64)
    assert a.images.tobytes() == b.images.tobytes() and a.labels.tolist() == b.labels.tolist()


@pytest.mark.slow
def test_a_camera_style_model_reads_fashion_mnist_through_its_card():
    mobilenet = get_model("fmnist-mobilenet")
    sources = open_sources(mobilenet, settings())
    assert sources.calibration.sample_shape == (3, 64, 64) == sources.test.sample_shape
    assert sources.calibration.describe().preprocess == mobilenet.preprocess
    check_model_fits(mobilenet, sources, 10)
    with pytest.raises(SourceMismatchError, match=r"are \[3, 64, 64\] but 'fmnist-cnn' takes \[1, 28, 28\]"):
        check_model_fits(CNN, sources, 10)
