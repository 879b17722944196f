"""report.md reads as a person would write it: drawn again from the committed artifact, it has no
``None``, no Python reprs, no long floats, and its plots name things as its tables do."""

from __future__ import annotations

import json
import re

import matplotlib.pyplot as plt
import pytest

from qpart.offline.report import (
    METHODS,
    bits,
    bits_figure,
    drops_figure,
    level,
    number,
    pct,
    size,
    write_report,
)
from qpart.profiles.artifacts import load_artifact


@pytest.fixture(scope="module", params=["fmnist-cnn", "fmnist-resnet"])
def artifact(request, artifacts_dir):
    return load_artifact(artifacts_dir / request.param)


def test_the_report_has_no_none_no_reprs_and_no_long_floats(artifact, tmp_path):
    text = write_report(artifact, tmp_path).read_text()
    assert "None" not in text and not re.search(r"\bnan\b", text.lower())  # (jetson-nano is a device's name)
    assert "{" not in text and "}" not in text and "[" not in text.replace("![", "")  # no dict or list reprs
    # a number written with more than 4 decimals (not a part of one, like arXiv id 2110.01052)
    assert not re.findall(r"(?<![\d.])\d\.\d{5,}", text), "a float with more than 4 decimals"
    assert "| validated (ours) | " in text and "| QPART as published | " in text
    assert "| lossless |" in text and "32 (float)" in text
    for name in ("drops.png", "payload.png", "bits.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_the_tightest_margin_is_a_percentage(artifacts_dir, tmp_path):
    text = write_report(load_artifact(artifacts_dir / "fmnist-cnn"), tmp_path).read_text()
    summary = json.loads((artifacts_dir / "fmnist-cnn" / "validation.json").read_text())["summary"]["qpart"]
    margin = summary["tightest_margin"]  # a fraction such as 0.0004000000000000001
    assert re.fullmatch(r"-?\d+\.\d\d%", pct(margin))
    assert f"| validated (ours) | {summary['patterns']} | {summary['violations']} | {pct(margin)} |" in text


def test_the_report_states_the_promise_or_that_the_artifact_predates_it(artifact, tmp_path):
    text = write_report(artifact, tmp_path).read_text()
    promise = text.split("## The promise\n\n")[1].split("\n")[0]
    if artifact.promise is None:
        assert promise.startswith("This artifact predates the promise")
    else:
        assert promise == artifact.promise.statement
        assert promise.startswith("For each pattern, with probability at least 1−δ over the draw of the "
                                  "check samples, its expected top-1 drop on data from the calibration "
                                  "distribution is at most its level")
    older = artifact.model_copy(update={"promise": None})
    assert "predates the promise" in write_report(older, tmp_path).read_text()


def test_the_report_shows_the_input_image_ladder_where_the_artifact_has_one(artifact, tmp_path):
    ladder = artifact.image_ladder
    assert ladder is not None  # both committed artifacts have one (ADR 0015)
    text = write_report(artifact, tmp_path).read_text()
    section = text.split("## Input-image plan\n\n")[1].split("\n## ")[0]
    assert section.startswith(ladder.statement)
    rows = [line for line in section.splitlines() if line.startswith("| webp |")]
    assert len(rows) == len(ladder.rungs)
    for row, rung in zip(rows, ladder.rungs, strict=True):
        cells = row.strip("| ").split(" | ")
        assert cells[1] == str(rung.quality) and cells[4] == pct(rung.calib_drop_ub)
        assert cells[2] == (", ".join(level(v) for v in rung.levels) or "—")
        assert cells[5] == pct(rung.test_drop)
    assert "## Input-image plan" not in write_report(artifact.model_copy(update={"image_ladder": None}),
                                                     tmp_path).read_text()


def test_the_bits_plot_labels_float_as_the_tables_do(artifact):
    fig = bits_figure(artifact)
    try:
        bar = fig.axes[-1]
        labels = [t.get_text() for t in bar.get_yticklabels()]
        assert labels[:8] == [str(b) for b in range(1, 9)] and labels[-1] == bits(32) == "32 (float)"
        assert "16" not in labels  # it once said "16 = float"
    finally:
        plt.close(fig)


def test_the_drops_legend_names_the_methods_of_the_table(artifact):
    fig = drops_figure(artifact)
    try:
        legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert set(METHODS.values()) <= set(legend)
    finally:
        plt.close(fig)


@pytest.mark.parametrize(("value", "shown"), [
    (0.0004000000000000001, "0.04%"), (-0.035, "-3.50%"), (-1e-6, "0.00%"), (None, "—"), (0.928, "92.80%"),
])
def test_percentages(value, shown):
    assert pct(value) == shown


def test_levels_sizes_and_numbers():
    assert [level(a) for a in (0, 0.001, 0.0025, 0.02)] == ["lossless", "0.1%", "0.25%", "2%"]
    assert [size(n) for n in (0, 452, 12595, 1911000)] == ["0 B", "452 B", "12.3 KiB", "1.82 MiB"]
    assert [number(x) for x in (52.0, 596.597, 31.137, 0.07678885, 0.000123)] == [
        "52", "597", "31.1", "0.0768", "1.23e-04"]
