"""A calibration without labels (issue 49): Fashion-MNIST exported as flat folders (labels
withheld), calibrated by the top1-agreement metric end to end, and a labelled metric on the same
data refused in one line before any work. Real model, real data, a small budget of samples."""

from __future__ import annotations

import pytest

from qpart.models.data import Split
from qpart.models.errors import LabelsError
from qpart.models.registry import get_model
from qpart.models.sources import export_image_folder
from qpart.offline.job import calibrate
from qpart.offline.settings import CalibrationSettings
from qpart.profiles.artifacts import FLOAT_BITS, load_artifact

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    root = tmp_path_factory.mktemp("flat")
    export_image_folder(Split.CALIBRATION, root / "cal", limit=900, flat=True)
    export_image_folder(Split.TEST, root / "test", limit=1000, flat=True)
    return root


def _settings(flat, metric: str) -> CalibrationSettings:
    return CalibrationSettings(
        metric=metric, data=str(flat / "cal"), test_data=str(flat / "test"), levels=(0.02, 0.05),
        fit_samples=300, check_samples=600, noise_samples=100, mapping_points=5, cuts=(0, 4, 8),
        batch_size=300, confidence=0.9, ladder=(-16, -8, -4, -2, 0, 2), image_qualities=(90, 50))


@pytest.fixture(scope="module")
def agreement_run(flat, tmp_path_factory):
    out = tmp_path_factory.mktemp("agree")
    return calibrate(get_model("fmnist-cnn"), _settings(flat, "top1-agreement"), out), out


def test_an_unlabelled_calibration_promises_agreement_with_the_float_model(agreement_run):
    artifact, out = agreement_run
    assert artifact.promise is not None and artifact.promise.metric == "top1-agreement"
    assert "share of inputs whose top-1 differs from the float model's" in artifact.promise.statement
    assert "exact one-sample bound" in artifact.promise.statement
    assert artifact.fp32_test_accuracy is None and artifact.data is not None
    assert artifact.data.calibration.classes == [] and artifact.data.test.classes == []
    report = (out / "report.md").read_text()
    assert "unknown (the test samples have no labels)" in report
    assert "(max top-1 disagreement, top1-agreement)" in report
    assert "Every drop below is measured in top1-agreement: the share of inputs" in report
    assert load_artifact(out) == artifact


def test_its_patterns_keep_their_level_on_the_unlabelled_test_split(agreement_run):
    artifact, _ = agreement_run
    quantized = [p for p in artifact.patterns
                 if p.level > 0 and any(b < FLOAT_BITS for b in [*p.weight_bits.values(), p.activation_bits])]
    assert quantized  # the check samples certified some
    for p in quantized:  # test_drop is the share of test inputs whose top-1 changed
        assert p.test_drop is not None and 0 <= p.test_drop <= p.level
        assert p.calib_drop_ub is not None and p.calib_drop_ub <= p.level


def test_a_labelled_metric_on_unlabelled_data_is_refused_before_any_work(flat, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(LabelsError, match=r"has no labels .* which the top1-drop metric needs; give --metric "
                                          r"top1-agreement") as exc:
        calibrate(get_model("fmnist-cnn"), _settings(flat, "top1-drop"), out)
    assert "\n" not in str(exc.value) and not (out / "checkpoint").exists()


def test_its_input_image_ladder_is_judged_by_agreement_too(agreement_run):
    artifact, _ = agreement_run
    ladder = artifact.image_ladder
    assert ladder is not None and "share of inputs whose top-1 differs" in ladder.statement
    assert [r.quality for r in ladder.rungs] == [90, 50]


def test_its_disagreement_is_its_test_drop(agreement_run):
    artifact, _ = agreement_run
    assert all(p.test_disagreement == p.test_drop for p in artifact.patterns)
