"""The calibration job end to end on a small budget of samples (real model, real data)."""

import json
import shutil

import pytest

from qpart.kernels.coding import Coding
from qpart.models.registry import get_model
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.image_ladder import measure_artifact_images
from qpart.offline.job import calibrate
from qpart.offline.report import markdown
from qpart.offline.settings import CalibrationSettings
from qpart.profiles.artifacts import FLOAT_BITS, load_artifact

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("calib")
    settings = CalibrationSettings(
        levels=(0.02,), fit_samples=300, check_samples=600, noise_samples=100, mapping_points=5,
        cuts=(0, 4, 8), test_samples=1000, batch_size=300, confidence=0.9,
        ladder=(-16, -8, -4, -2, 0, 2),  # 300 fit samples place the ladder loosely: deeper first rungs
    )
    artifact = calibrate(get_model("fmnist-cnn"), settings, out)
    return artifact, out


def test_every_pattern_passed_its_bound_on_calibration_data(small_run):
    artifact, _ = small_run
    for p in artifact.patterns:
        quantized = any(b < FLOAT_BITS for b in [*p.weight_bits.values(), p.activation_bits])
        if p.level == 0:
            assert (p.rungs, p.passed, p.calib_drop_ub) == (None, None, None)
            continue
        assert p.rungs is not None and p.passed is not None and 0 <= p.passed <= p.rungs
        if p.passed:  # the fewest bits among the rungs that passed before the first failure
            assert quantized and p.calib_drop_ub is not None and p.calib_drop_ub <= p.level
        else:  # the first rung failed: lossless, not checked
            assert not quantized and p.calib_drop_ub is None


def test_the_artifact_states_its_promise(small_run):
    artifact, out = small_run
    assert artifact.promise is not None
    assert (artifact.promise.delta, artifact.promise.check_samples, artifact.promise.bound) == (
        pytest.approx(0.1), 600, "exact")
    assert "δ = 0.1;" in artifact.promise.statement and "600 check samples" in artifact.promise.statement
    assert artifact.promise.statement in (out / "report.md").read_text()
    assert json.loads((out / "validation.json").read_text())["promise"]["delta"] == pytest.approx(0.1)


def test_artifact_round_trips_and_lists_lossless_patterns(small_run):
    artifact, out = small_run
    loaded = load_artifact(out)
    assert loaded == artifact
    lossless = [p for p in loaded.patterns if p.level == 0]
    assert {p.cut for p in lossless} == {0, 4, 8}
    assert all(p.test_drop == 0 for p in lossless)
    # how far each cut's packets deflate, measured on calibration samples (every cut: the benchmarks'
    # baselines upload at pruned cuts too); the last cut uploads nothing
    every = [*range(1, 9), 32]
    for coding in Coding:
        assert [sorted(c.coding_ratio[coding]) for c in loaded.cuts[:-1]] == [every] * (len(loaded.cuts) - 1)
    assert loaded.cuts[-1].coding_ratio == {}
    assert 0 < loaded.cuts[0].coding_ratio[Coding.DEFLATE][32] < 0.6
    assert 0 < loaded.cuts[0].coding_ratio[Coding.ZSTD][32] < 0.7


def test_validation_json_has_the_documented_fields(small_run):
    _, out = small_run
    doc = json.loads((out / "validation.json").read_text())
    assert {"model", "levels", "patterns", "baseline_qpart_paper"} <= set(doc)
    timing = json.loads((out / "timing.json").read_text())  # this run's seconds, not in the artifact
    assert {"fast", "stage_cut_choice", "stage_validation"} <= set(timing["timing_s"])
    assert "direct" not in timing["timing_s"]  # the second estimator's tables: research, off by default
    row = doc["patterns"][0]
    assert {"cut", "level", "predicted_drop", "test_drop", "weight_bytes", "fp32_weight_bytes",
            "activation_bits"} <= set(row)
    for name in ("drops.png", "payload.png", "bits.png", "report.md"):
        assert (out / name).stat().st_size > 0


def test_head_payload_shrinks_below_fp32(small_run):
    artifact, _ = small_run
    full = next(p for p in artifact.patterns if p.cut == 8 and p.level == 0.02)
    assert full.weight_bytes < 0.5 * full.fp32_weight_bytes


def test_worker_processes_change_no_pattern(small_run, tmp_path):
    """The pool (two workers of one thread each) chooses and measures what this process does alone
    with one thread; only the tables' float rounding (two threads against one) may differ."""
    artifact, _ = small_run
    assert artifact.settings["workers"] == 2 and artifact.settings["threads"] == 2
    alone = calibrate(get_model("fmnist-cnn"), artifact_settings(artifact, workers=1, threads=1), tmp_path)
    assert alone.settings["workers"] == 1
    rounding = {"predicted_noise", "predicted_drop"}
    for ours, theirs in zip([*alone.patterns, *alone.baseline_qpart_paper],
                            [*artifact.patterns, *artifact.baseline_qpart_paper], strict=True):
        a, b = ours.model_dump(), theirs.model_dump()
        exact = sorted(set(a) - rounding)
        assert [a[k] for k in exact] == [b[k] for k in exact]
        assert [a[k] for k in sorted(rounding)] == pytest.approx([b[k] for k in sorted(rounding)], rel=1e-6)


def artifact_settings(artifact, **changes):
    kept = {k: v for k, v in artifact.settings.items() if k in CalibrationSettings.model_fields}
    return CalibrationSettings(**{**kept, **changes})


def test_the_artifact_carries_its_input_image_ladder(small_run):
    artifact, out = small_run
    ladder = artifact.image_ladder
    assert ladder is not None and ladder.check_samples == 600 and ladder.test_samples == 1000
    assert [r.quality for r in ladder.rungs] == list(CalibrationSettings().image_qualities)
    assert "δ = 0.1" in ladder.statement and "600 check samples" in ladder.statement
    assert "at least 1−δ" in ladder.statement  # the exact bound's coverage is exact
    assert any(rung.levels for rung in ladder.rungs)  # WebP at 95 keeps 2% of 600 samples by far
    for rung in ladder.rungs:
        assert set(rung.levels) <= {0.02}
        assert (rung.test_drop is None) == (not rung.levels)  # measured on test where promised only
        if rung.levels:
            assert rung.calib_drop_ub <= 0.02
    assert load_artifact(out).image_ladder == ladder


def test_calibrate_images_measures_the_same_ladder_into_an_existing_artifact(small_run, tmp_path):
    artifact, out = small_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with pytest.raises(CalibrationConfigError, match="has an input-image ladder already"):
        measure_artifact_images(copy)  # one ladder per check samples: a second is refused
    stripped = artifact.model_copy(update={"image_ladder": None})
    (copy / "artifact.json").write_text(stripped.model_dump_json(indent=1))
    (copy / "report.md").write_text(markdown(stripped))
    assert measure_artifact_images(copy) == artifact.image_ladder
    assert load_artifact(copy) == artifact
    assert (copy / "report.md").read_text() == markdown(artifact)  # the report shows the ladder
    fewer = measure_artifact_images(copy, [95, 50], replace_ladder=True)  # replaced knowingly
    assert [r.quality for r in fewer.rungs] == [95, 50] and load_artifact(copy).image_ladder == fewer
    assert sum(line.startswith("| webp |") for line in (copy / "report.md").read_text().splitlines()) == 2


def test_a_labelled_run_records_each_patterns_test_disagreement_beside_its_drop(small_run):
    """Issue 49: the artifact carries the share of test samples whose top-1 changed (the live
    audit's reference), which bounds the top-1 drop measured on the same run."""
    artifact, _ = small_run
    assert artifact.schema_version == 8 and artifact.metric == "top1-drop"
    for p in artifact.patterns:
        assert p.test_drop is not None and p.test_disagreement is not None
        assert p.test_drop <= p.test_disagreement + 1e-12
        if p.level == 0:
            assert p.test_disagreement == 0.0
