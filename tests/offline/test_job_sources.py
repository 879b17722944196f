"""The calibration job on sources other than today's splits: Fashion-MNIST read as IDX and as its
exported ImageFolder give the same patterns with the same seed (issue 24, acceptance 1), the
artifact records both sources, and refused data writes nothing."""

from __future__ import annotations

import shutil

import pytest

from qpart.models.data import Split
from qpart.models.errors import SampleOverlapError
from qpart.models.registry import get_model
from qpart.models.sources import FashionMnistSource, ImageFolderSource, export_image_folder
from qpart.offline.coding import measure_artifact
from qpart.offline.data import Sources
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.job import calibrate
from qpart.offline.settings import CalibrationSettings
from qpart.profiles.artifacts import load_artifact

pytestmark = pytest.mark.slow

SMALL = CalibrationSettings(
    levels=(0.02,), fit_samples=300, check_samples=600, noise_samples=100, mapping_points=5,
    cuts=(0, 4, 8), batch_size=300, confidence=0.9, ladder=(-16, -8, -4, -2, 0, 2),
    measure_both=False, baseline=False, threads=1, workers=1,
)


@pytest.fixture(scope="module")
def both_paths(tmp_path_factory):
    """fmnist-cnn calibrated on the first 1,000 calibration and 500 test images, as IDX and as PNGs."""
    root = tmp_path_factory.mktemp("sources")
    export_image_folder(Split.CALIBRATION, root / "cal", limit=1000)
    export_image_folder(Split.TEST, root / "test", limit=500)
    spec = get_model("fmnist-cnn")
    idx = Sources(FashionMnistSource(Split.CALIBRATION, limit=1000),
                  FashionMnistSource(Split.TEST, limit=500), "digest")
    folder = Sources(ImageFolderSource(root / "cal", spec.preprocess),
                     ImageFolderSource(root / "test", spec.preprocess), "digest")
    from_idx = calibrate(spec, SMALL, root / "out-idx", sources=idx)
    from_folder = calibrate(spec, SMALL, root / "out-folder", sources=folder)
    return from_idx, from_folder, root


def test_an_image_folder_export_gives_the_patterns_idx_gives(both_paths):
    from_idx, from_folder, _ = both_paths
    assert [p.model_dump() for p in from_folder.patterns] == [p.model_dump() for p in from_idx.patterns]
    assert from_folder.fp32_test_accuracy == from_idx.fp32_test_accuracy
    assert from_folder.noise_budgets == from_idx.noise_budgets
    assert any(p.level > 0 and p.passed for p in from_idx.patterns)  # something was quantized


def test_the_artifact_records_each_source(both_paths):
    from_idx, from_folder, root = both_paths
    data = load_artifact(root / "out-folder").data
    assert data is not None and data == from_folder.data
    assert (data.calibration.kind, data.calibration.count, data.test.count) == ("image-folder", 1000, 500)
    assert data.calibration.location == str(root / "cal") and data.sample_order == "digest"
    assert (data.fit_samples, data.check_samples, data.test_samples) == (300, 600, 500)
    assert from_idx.data is not None and from_idx.data.calibration.kind == "fashion-mnist"
    # the same images, but PNG files and float32 tensors digest differently
    assert data.calibration.content_sha256 != from_idx.data.calibration.content_sha256
    assert "train" not in from_folder.splits and "calibration_use" in from_folder.splits


def test_measure_coding_reopens_each_recorded_source_and_refuses_other_data(both_paths, tmp_path):
    _, _, root = both_paths
    copies = {name: tmp_path / name for name in ("out-idx", "out-folder")}
    for name, copy in copies.items():
        shutil.copytree(root / name, copy)
    from_idx = measure_artifact(copies["out-idx"], samples=30)  # the built-in split, 1,000 read
    from_folder = measure_artifact(copies["out-folder"], samples=30)  # the recorded folder
    # digest order takes the same 30 images from the PNGs as from IDX: the same packets
    assert [c.coding_ratio for c in from_folder.cuts] == [c.coding_ratio for c in from_idx.cuts]
    assert from_folder.cuts[0].coding_ratio
    moved = tmp_path / "moved-cal"
    shutil.copytree(root / "cal", moved)
    assert measure_artifact(copies["out-folder"], samples=30, data=str(moved)).cuts == from_folder.cuts
    with pytest.raises(CalibrationConfigError, match="does not hold the data"):
        measure_artifact(copies["out-folder"], samples=30, data=str(root / "test"))


def test_a_refused_run_leaves_the_output_folder_untouched(both_paths):
    _, _, root = both_paths
    out = root / "kept"
    out.mkdir()
    (out / "artifact.json").write_text("an older artifact")
    overlapping = CalibrationSettings(**{**SMALL.model_dump(), "data": str(root / "cal"),
                                         "test_data": str(root / "cal")})
    with pytest.raises(SampleOverlapError):
        calibrate(get_model("fmnist-cnn"), overlapping, out)
    assert [p.name for p in out.iterdir()] == ["artifact.json"]
    assert (out / "artifact.json").read_text() == "an older artifact"
