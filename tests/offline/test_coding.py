"""qpart measure-coding: deflate and zstd ratios into an existing artifact, nothing else changed."""

from __future__ import annotations

import shutil

import pytest

from qpart.kernels.coding import Coding
from qpart.offline.coding import measure_artifact
from qpart.offline.errors import CalibrationConfigError
from qpart.profiles.artifacts import load_artifact


@pytest.fixture
def copy(artifacts_dir, tmp_path):
    folder = tmp_path / "fmnist-cnn"
    shutil.copytree(artifacts_dir / "fmnist-cnn", folder)
    return folder


def test_the_ratios_are_measured_and_nothing_else_changes(copy):
    before = load_artifact(copy)
    stripped = before.model_copy(update={"cuts": [c.model_copy(update={"coding_ratio": {}})
                                                  for c in before.cuts]})
    (copy / "artifact.json").write_text(stripped.model_dump_json(indent=1))
    after = measure_artifact(copy, samples=40)
    assert load_artifact(copy) == after
    assert after.patterns == before.patterns and after.baseline_qpart_paper == before.baseline_qpart_paper
    for cut in after.cuts[:-1]:
        assert sorted(cut.coding_ratio) == sorted(Coding)
        for ratios in cut.coding_ratio.values():
            assert sorted(ratios) == [*range(1, 9), 32]
            assert all(0 < r < 1.2 for r in ratios.values())
    assert after.cuts[-1].coding_ratio == {}
    # 40 samples against the committed 500: the same picture, to a few percent
    first, committed = after.cuts[0].coding_ratio, before.cuts[0].coding_ratio
    for coding in Coding:
        assert first[coding][4] == pytest.approx(committed[coding][4], rel=0.1)
    # zstd at level 1 gives up a little size for speed: Fashion-MNIST's input, 4 bits
    assert 1.0 < first[Coding.ZSTD][4] / first[Coding.DEFLATE][4] < 1.15


def test_other_weights_or_too_many_samples_are_refused(copy):
    with pytest.raises(CalibrationConfigError, match="fit range holds 4000"):
        measure_artifact(copy, samples=4001)
    (copy / "weights.safetensors").write_bytes(b"not the weights")
    with pytest.raises(CalibrationConfigError, match="sha256"):
        measure_artifact(copy, samples=10)


def test_ratios_for_another_number_of_cuts_are_refused(copy):
    from qpart.offline.coding import with_coding_ratios

    artifact = load_artifact(copy)
    n = len(artifact.cuts)
    for wrong in (n - 1, n + 1):
        with pytest.raises(CalibrationConfigError, match=f"{wrong} zstd ratios for an artifact of {n} cuts"):
            with_coding_ratios(artifact, {Coding.ZSTD: [{4: 0.5}] * wrong})


def test_a_split_builtin_source_is_reopened_from_its_parent():
    """An artifact calibrated with --test-fraction on Fashion-MNIST: its calibration record is the
    split's part, whose count is not the parent's; measure-coding reopens the parent and splits it."""
    from types import SimpleNamespace

    from qpart.models.data import Split
    from qpart.models.registry import get_model
    from qpart.models.sources import FashionMnistSource, split_source
    from qpart.offline.coding import _fit_images
    from qpart.profiles.artifacts import DataRecord

    part = split_source(FashionMnistSource(Split.CALIBRATION), test_count=100, seed=3).calibration
    record = DataRecord.model_validate(part.describe().model_dump(mode="json"))
    data = SimpleNamespace(calibration=record, sample_order="source")
    artifact = SimpleNamespace(model="fmnist-cnn", data=data, settings={})
    images = _fit_images(artifact, get_model("fmnist-cnn"), None, 5, 30)  # type: ignore[arg-type]
    want = next(part.select(list(range(5, 35))).batches(30)).images
    assert images.shape == (30, 1, 28, 28) and (images == want).all()
