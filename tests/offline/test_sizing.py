"""offline.sizing: sample counts from the data's size, refused before anything is decoded, and the
levels a number of check samples can certify, by the job's own bound (issue 48)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from qpart.models.preprocess import PreprocessSpec
from qpart.models.sources import ImageFolderSource
from qpart.offline import ltt
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.settings import DEFAULT_LEVELS, CalibrationSettings
from qpart.offline.sizing import (
    check_levels,
    checks_needed,
    default_split,
    guidance_table,
    lossless_levels,
    resolve_samples,
    size_job,
    smallest_level,
    uncertified_levels,
)
from qpart.offline.validation import PairedDrop

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guide" / "how-much-data.md"
TABLE_LEVELS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05)


@pytest.mark.parametrize(("available", "split"), [
    (4955, (1982, 2973)), (359, (143, 216)), (250, (100, 150)), (200, (100, 100)),
    (9999, (3999, 6000)), (10_000, (4000, 6000)), (60_000, (4000, 6000)),
])
def test_the_split_follows_the_documented_rule(available, split):
    assert default_split(available) == split


def test_too_few_samples_for_any_calibration_are_refused_naming_the_least():
    with pytest.raises(CalibrationConfigError, match="needs at least 200"):
        default_split(199)


def test_counts_not_given_come_from_the_size_and_noise_samples_never_exceed_the_fit_samples():
    s = resolve_samples(CalibrationSettings(), 359, "cal")
    assert (s.fit_samples, s.check_samples, s.noise_samples) == (143, 216, 143)
    assert resolve_samples(CalibrationSettings(), 50_000, "cal").noise_samples == 2000
    given = resolve_samples(CalibrationSettings(fit_samples=3000), 4955, "cal")
    assert (given.fit_samples, given.check_samples) == (3000, 1955)  # the rest, under the rule's 2,973
    given = resolve_samples(CalibrationSettings(check_samples=1000), 4955, "cal")
    assert (given.fit_samples, given.check_samples) == (1982, 1000)


@pytest.mark.parametrize(("changes", "shown"), [
    ({"fit_samples": 4000, "check_samples": 6000},
     "--fit-samples 4000 + --check-samples 6000 ask for 10,000 of the 4,955 calibration"),
    ({"check_samples": 6000}, "--check-samples 6000 asks for 6,000 of the 4,955 calibration"),
    ({"fit_samples": 4900}, "--fit-samples 4900 would leave 4,900 fit and 55 check samples"),
])
def test_counts_that_exceed_the_data_are_refused_in_one_line_with_a_split_that_fits(changes, shown):
    with pytest.raises(CalibrationConfigError) as err:
        resolve_samples(CalibrationSettings(**changes), 4955, "data/cal")
    text = str(err.value)
    assert shown in text and "4,955 calibration samples in data/cal" in text and "\n" not in text
    assert "--fit-samples 1982 --check-samples 2973" in text


def test_the_smallest_certifiable_level_is_the_bound_with_nothing_lost():
    for n in (216, 2973, 6000):
        assert smallest_level(n, 0.95, "exact") == PairedDrop(n, 0, 0).upper_bound(0.95, "exact")
        assert smallest_level(n, 0.95, "exact") == pytest.approx(math.log(40) / n, rel=0.01)  # ~3.7/n


@pytest.mark.parametrize("bound", ["exact", "newcombe"])
@pytest.mark.parametrize("level", [0.001, 0.01, 0.05])
def test_checks_needed_is_the_fewest_samples_whose_bound_passes(level, bound):
    test = ltt.Test(level, 0.95, bound)
    n = checks_needed(level, 0.95, bound)
    assert test.passes(PairedDrop(n, 0, 0)) and not test.passes(PairedDrop(n - 1, 0, 0))
    half = checks_needed(level, 0.95, bound, 0.5)
    assert half > n and test.passes(PairedDrop(half, math.ceil(half * level / 2), 0))


def test_levels_the_check_samples_cannot_certify_are_refused_naming_each_need_and_the_flag():
    s = resolve_samples(CalibrationSettings(), 359, "cal")
    assert uncertified_levels(s) == (0.001, 0.0025, 0.005, 0.01) and lossless_levels(s) == ()
    with pytest.raises(CalibrationConfigError) as err:
        check_levels(s)
    text = str(err.value)
    assert text.startswith("levels 0.1%, 0.25%, 0.5%, 1% cannot be certified with 216 check samples")
    assert "0.1% needs 3,688" in text and "1% needs 368" in text and "--uncertified lossless" in text
    kept = s.model_copy(update={"uncertified": "lossless"})
    check_levels(kept)
    assert lossless_levels(kept) == (0.001, 0.0025, 0.005, 0.01)


def test_the_shipped_split_certifies_every_default_level():
    s = resolve_samples(CalibrationSettings(), 10_000, "fashion-mnist")
    assert s.levels == DEFAULT_LEVELS and uncertified_levels(s) == ()


def test_defaults_adapt_to_4955_images_without_decoding_any(tmp_path):
    """4,955 files that are not images: opening the folder reads names, never pixels, and the
    job's sizing refuses the 0.1% level from the adapted 2,973 check samples."""
    for i in range(4955):
        folder = tmp_path / f"c{i % 5}"
        folder.mkdir(exist_ok=True)
        (folder / f"{i:05d}.png").write_bytes(f"not an image {i}".encode())
    spec = PreprocessSpec.from_mapping({"color": "L", "resize": [8, 8], "mean": [0.5], "std": [0.5]})
    source = ImageFolderSource(tmp_path, spec)
    resolved = resolve_samples(CalibrationSettings(), len(source), str(tmp_path))
    assert (resolved.fit_samples, resolved.check_samples) == (1982, 2973)
    with pytest.raises(CalibrationConfigError, match=r"level 0\.1% cannot be certified with 2,973 check"):
        size_job(CalibrationSettings(), len(source), str(tmp_path))


def test_the_guide_holds_the_table_the_module_computes():
    table = guidance_table(TABLE_LEVELS, CalibrationSettings().confidence, CalibrationSettings().bound)
    assert table in GUIDE.read_text(encoding="utf-8"), (
        "docs/guide/how-much-data.md's table is stale: paste offline.sizing.guidance_table's output")


def test_the_agreement_metric_certifies_with_fewer_samples_and_says_what_it_needs():
    """Issue 49, acceptance 3: under top1-agreement (a one-sample bound), a level the check
    samples cannot certify is refused before any work, naming the level and the samples it needs;
    0 flips among n bound the rate at about 3/n (95%), against about 3.7/n for the paired bound."""
    s = resolve_samples(CalibrationSettings(metric="top1-agreement"), 359, "cal")
    assert s.paired is False and uncertified_levels(s) == (0.001, 0.0025, 0.005, 0.01)
    with pytest.raises(CalibrationConfigError) as err:
        check_levels(s)
    text = str(err.value)
    need = checks_needed(0.001, 0.95, "exact", paired=False)
    assert need == 2995 and need < checks_needed(0.001, 0.95, "exact")  # 3,688 paired
    assert text.startswith("levels 0.1%, 0.25%, 0.5%, 1% cannot be certified with 216 check samples")
    assert f"0.1% needs {need:,}" in text and "under the top1-agreement metric" in text and "\n" not in text
    assert smallest_level(6000, 0.95, "exact", paired=False) == pytest.approx(3 / 6000, rel=0.01)
