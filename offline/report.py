"""Outputs of the calibration job: ``artifact.json``, ``validation.json``, ``report.md`` + PNG plots.

The report and its plots are drawn from the artifact alone, so a saved one can be drawn again
without calibrating: ``python -m qpart.offline.report DIR...``. Numbers are written for people:
drops and levels as percentages, sizes in B/KiB/MiB, an em dash where there is no figure.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: the job runs on servers and in CI
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from qpart.models.metrics import DEFAULT_METRIC, get_metric
from qpart.offline.report_cuts import cut_choice_lines
from qpart.profiles.artifacts import (
    FLOAT_BITS,
    CalibrationArtifact,
    Pattern,
    load_artifact,
    save_artifact,
    write_atomic,
)

NONE = "—"  # a figure that does not exist (not measured, not applicable)
METHODS = {"qpart": "validated (ours)", "baseline_qpart_paper": "QPART as published"}
"""``validation.json``'s summary keys and their names in the report's table and plot legend."""
TIMINGS = {"direct": "noise tables, direct estimator", "fast": "noise tables, fast estimator",
           "total_without_report": "the whole job before the report"}


def _row(p: Pattern) -> dict[str, object]:
    return {"cut": p.cut, "level": p.level, "predicted_drop": p.predicted_drop, "test_drop": p.test_drop,
            "weight_bytes": p.weight_bytes, "fp32_weight_bytes": p.fp32_weight_bytes,
            "activation_bits": p.activation_bits, "calib_drop": p.calib_drop,
            "calib_drop_ub": p.calib_drop_ub, "weight_bits": p.weight_bits,
            "activation_bytes": p.activation_bytes, "rungs": p.rungs, "passed": p.passed}


def _violations(patterns: list[Pattern]) -> dict[str, object]:
    graded = [p for p in patterns if p.level > 0 and p.test_drop is not None]
    margins = [p.level - p.test_drop for p in graded if p.test_drop is not None]
    return {"patterns": len(graded), "violations": sum(m < 0 for m in margins),
            "tightest_margin": min(margins) if margins else None}


def _summary(artifact: CalibrationArtifact) -> dict[str, dict[str, object]]:
    graded = [p for p in artifact.patterns if p.level > 0]
    return {"qpart": _violations(graded), "baseline_qpart_paper": _violations(artifact.baseline_qpart_paper)}


def validation_doc(artifact: CalibrationArtifact, agreement: dict[str, object]) -> dict[str, object]:
    """The ``validation.json`` document (drops as fractions)."""
    graded = [p for p in artifact.patterns if p.level > 0]
    return {
        "model": artifact.model, "version": artifact.version, "levels": artifact.settings["levels"],
        "fp32_test_accuracy": artifact.fp32_test_accuracy,
        "patterns": [_row(p) for p in graded],
        "baseline_qpart_paper": [_row(p) for p in artifact.baseline_qpart_paper],
        "summary": _summary(artifact),
        "promise": artifact.promise.model_dump() if artifact.promise else None,
        "additivity_error": artifact.additivity_error,
        "estimator_agreement": agreement,
    }


# ---- numbers for people -------------------------------------------------------------------

def pct(x: float | None, digits: int = 2) -> str:
    """A fraction as a percentage at fixed ``digits`` (``0.0004`` -> ``0.04%``)."""
    if x is None or not math.isfinite(x):
        return NONE
    shown = f"{x * 100:.{digits}f}"
    return f"{0:.{digits}f}%" if float(shown) == 0 else f"{shown}%"  # no "-0.00%"


def level(x: float) -> str:
    """An accuracy level: ``lossless`` or its percentage without trailing zeros (``0.25%``, ``2%``)."""
    if x == 0:
        return "lossless"
    return f"{x * 100:.4f}".rstrip("0").rstrip(".") + "%"


def size(n: int | float) -> str:
    """Bytes in B, KiB or MiB (``12.3 KiB``)."""
    if n < 1024:
        return f"{n:.0f} B"
    if n < 1024**2:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 1024**2:.2f} MiB"


def number(x: float) -> str:
    """A measured figure to three significant digits, never more than four decimals."""
    if not math.isfinite(x):
        return NONE
    if x == 0 or x.is_integer():
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 0.01:
        return f"{x:.3g}"
    return f"{x:.2e}"


def plain(value: object) -> str:
    """Any other artifact value in words: spans as ``a–b``, mappings as ``key value, ...``."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{str(k).replace('_', ' ')} {plain(v)}" for k, v in value.items())
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) == 2 and all(isinstance(v, int) for v in value):
            return f"{value[0]:,}–{value[1]:,}"
        return ", ".join(plain(v) for v in value)
    return str(value)


def bits(b: int) -> str:
    """A bit width as the tables and the bits plot name it."""
    return f"{b} (float)" if b >= FLOAT_BITS else str(b)


def _levels(artifact: CalibrationArtifact) -> list[float]:
    """The accuracy levels the calibration was asked for (its settings)."""
    levels = artifact.settings.get("levels")
    return [float(a) for a in levels if isinstance(a, int | float)] if isinstance(levels, list) else []


# ---- plots --------------------------------------------------------------------------------

def drops_figure(artifact: CalibrationArtifact) -> Figure:
    """Measured test drop against the requested level, per method (:data:`METHODS`)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, pats, marker in (("qpart", artifact.patterns, "o"),
                              ("baseline_qpart_paper", artifact.baseline_qpart_paper, "x")):
        pts = [(p.level, p.test_drop) for p in pats if p.level > 0 and p.test_drop is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.scatter(np.array(xs) * 100, np.array(ys) * 100, marker=marker, label=METHODS[key], alpha=0.7)
    levels = np.array(_levels(artifact)) * 100
    ax.plot(levels, levels, "k--", label="requested")
    ax.set_xscale("log")
    ax.set_xlabel("requested max drop (%)")
    ax.set_ylabel("measured test drop (%)")
    ax.legend()
    ax.set_title(f"{artifact.model}: measured vs requested degradation")
    fig.tight_layout()
    return fig


def payload_figure(artifact: CalibrationArtifact) -> Figure:
    """Head segment plus activation bytes against the level, one line per cut."""
    fig, ax = plt.subplots(figsize=(6, 4))
    levels = sorted({p.level for p in artifact.patterns if p.level > 0})
    for cut in sorted({p.cut for p in artifact.patterns}):
        ys = [next(((p.weight_bytes + p.activation_bytes) / 1024 for p in artifact.patterns
                    if p.cut == cut and p.level == lv), np.nan) for lv in levels]
        ax.plot(np.array(levels) * 100, ys, marker="o", label=f"cut {cut}")
    ax.set_xscale("log")
    ax.set_xlabel("accuracy level (max drop, %)")
    ax.set_ylabel("head segment + activation (KiB)")
    ax.set_title(f"{artifact.model}: payload vs level per cut")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def bits_figure(artifact: CalibrationArtifact) -> Figure:
    """Bits of every head tensor and of the uploaded activation, per pattern; one colour per bit
    width, float32 labelled as the tables label it (:func:`bits`)."""
    names = [t.name for t in artifact.tensors] + ["activation"]
    rows = [p for p in artifact.patterns if p.level > 0]
    last = len(artifact.cuts) - 1
    cells = [[p.weight_bits.get(n) for n in names[:-1]] + [p.activation_bits if p.cut < last else None]
             for p in rows]
    widths = sorted({*range(1, 9), *(b for row in cells for b in row if b is not None)})
    grid = np.array([[np.nan if b is None else widths.index(b) for b in row] for row in cells], dtype=float)
    fig, ax = plt.subplots(figsize=(1 + 0.5 * len(names), 1 + 0.18 * len(rows)))
    im = ax.imshow(grid.reshape(len(rows), len(names)), aspect="auto",
                   cmap=plt.get_cmap("viridis", len(widths)), vmin=-0.5, vmax=len(widths) - 0.5)
    ax.set_xticks(range(len(names)), names, rotation=70, fontsize=7)
    ax.set_yticks(range(len(rows)), [f"cut {p.cut} @ {level(p.level)}" for p in rows], fontsize=6)
    bar = fig.colorbar(im, ax=ax, ticks=range(len(widths)))
    bar.ax.set_yticklabels([bits(b) for b in widths])
    bar.set_label("bits (blank: not in the head, or nothing uploaded)")
    ax.set_title(f"{artifact.model}: bits per layer")
    fig.tight_layout()
    return fig


# ---- report.md ----------------------------------------------------------------------------

def _additivity(errors: Mapping[str, float]) -> str:
    keys = ("median_abs_rel_error", "max_abs_rel_error", "min_ratio_predicted_to_measured",
            "max_ratio_predicted_to_measured", "points")
    if not all(k in errors for k in keys):
        return plain(errors)
    e = errors
    return (f"over {e['points']:.0f} mixed patterns, the predicted total noise is off by "
            f"{pct(e['median_abs_rel_error'], 1)} (median) and at most {pct(e['max_abs_rel_error'], 1)}; "
            f"predicted over measured ranges {number(e['min_ratio_predicted_to_measured'])}–"
            f"{number(e['max_ratio_predicted_to_measured'])}")


def _memory(timing: dict[str, float]) -> list[str]:
    """The job's peak memory, where the run recorded it (timing.json's ``peak_rss_mib_*``)."""
    if "peak_rss_mib_job" not in timing:
        return []
    return [f"Peak RSS: the job {number(timing['peak_rss_mib_job'])} MiB, its largest worker process "
            f"(validation or image decoding) {number(timing.get('peak_rss_mib_largest_worker', 0.0))} MiB "
            "(0: none).", ""]


def _pattern_row(p: Pattern, last: int) -> str:
    uploads = p.cut < last
    of_fp32 = pct(p.weight_bytes / p.fp32_weight_bytes) if p.fp32_weight_bytes else NONE
    ladder = f"{p.passed} of {p.rungs}" if p.rungs is not None and p.passed is not None else NONE
    cells = [str(p.cut), level(p.level), bits(p.activation_bits) if uploads else NONE,
             size(p.activation_bytes) if uploads else NONE, size(p.weight_bytes), of_fp32,
             pct(p.predicted_drop), ladder, pct(p.calib_drop_ub), pct(p.test_drop)]
    return "| " + " | ".join(cells) + " |"


def _promise(artifact: CalibrationArtifact) -> str:
    if artifact.promise is None:
        return ("This artifact predates the promise (schema 3): its patterns come from a search over "
                "budgets on the check samples, which passed each a bound but backs no statement about "
                "the chance of a wrong one. Re-calibrate for one.")
    return artifact.promise.statement


def _test_source(artifact: CalibrationArtifact) -> str:
    """What the test split was, as the artifact records it (before schema 4: the official t10k)."""
    if artifact.data is None:
        return "the official t10k images"
    test, used = artifact.data.test, artifact.data.test_samples
    official = test.location.startswith("fashion-mnist:test@") and test.split is None
    if test.kind == "fashion-mnist" and official:
        what = "the official t10k images"
    else:
        what = f"{test.kind} {test.location}" + (" (a seeded split of the calibration source)"
                                                  if test.split is not None else "")
    return f"{what}, {used:,} of {test.count:,} samples" if used < test.count else f"{what}, {used:,} samples"


def _lossless_levels(artifact: CalibrationArtifact) -> list[str]:
    """The levels kept lossless because the check samples could not certify them, if any."""
    if not artifact.lossless_levels:
        return []
    shown = ", ".join(level(a) for a in artifact.lossless_levels)
    checks = f"{artifact.promise.check_samples:,} check samples" if artifact.promise else "the check samples"
    return [f"**Levels kept lossless: {shown}.** {checks.capitalize()} cannot certify them even with no "
            "sample lost, so at these levels every cut's pattern is float32 (lossless) and untested, "
            "as asked (`--uncertified lossless`); a plan at such a demand sends float32 and says "
            "`lossless: true`. More check samples certify them: docs/guide/how-much-data.md.", ""]


def _image_ladder(artifact: CalibrationArtifact) -> list[str]:
    """The input-image plan's qualities and what backs them (ADR 0015), where the artifact has them."""
    ladder = artifact.image_ladder
    if ladder is None:
        return []
    lines = ["## Input-image plan", "", ladder.statement, "",
             f"Encoder: {ladder.encoder}. Promised at: the levels whose fixed-sequence test the quality "
             f"passed ({NONE}: none). Check bound: the upper confidence bound of the drop on the "
             f"{ladder.check_samples:,} check samples. Test drop: on {ladder.test_samples:,} test images "
             f"({NONE}: not promised, not measured). Bytes: the mean encoded size on the check samples.", "",
             "| codec | quality | promised at | check drop | check bound | test drop | bytes |",
             "|---|---|---|---|---|---|---|"]
    for r in ladder.rungs:
        promised = ", ".join(level(v) for v in r.levels) or NONE
        lines.append(f"| {r.codec} | {r.quality} | {promised} | {pct(r.calib_drop)} | {pct(r.calib_drop_ub)} "
                     f"| {pct(r.test_drop)} | {size(r.mean_bytes)} |")
    return [*lines, ""]


def markdown(artifact: CalibrationArtifact) -> str:
    """The text of ``report.md``."""
    summary = _summary(artifact)
    levels = ", ".join(level(a) for a in _levels(artifact))
    accuracy = "unknown (the test samples have no labels)" if artifact.fp32_test_accuracy is None \
        else pct(artifact.fp32_test_accuracy)
    lines = [
        f"# Calibration report: {artifact.model} (version {artifact.version})", "",
        f"fp32 test accuracy {accuracy}. Accuracy levels (max {get_metric(artifact.metric).short}, "
        f"{artifact.metric}): {levels}.",
        *([f"Every drop below is measured in {artifact.metric}: the "
           f"{get_metric(artifact.metric).summary.removeprefix('expected ')}."]
          if artifact.metric != DEFAULT_METRIC else []),
        f"Calibration samples used: {plain(artifact.splits.get('calibration_use'))}; "
        f"test = {_test_source(artifact)}, read once per final pattern.",
        "", "## The promise", "", _promise(artifact), "", *_lossless_levels(artifact),
        "## Promise kept on the test split", "",
        "Margin: the level less the measured test drop (negative: the promise was broken).", "",
        "| method | patterns | violations (test drop > level) | tightest margin |", "|---|---|---|---|",
    ]
    for key, name in METHODS.items():
        v = summary[key]
        margin = v["tightest_margin"]
        lines.append(f"| {name} | {v['patterns']} | {v['violations']} | "
                     f"{pct(margin if isinstance(margin, float) else None)} |")
    last = len(artifact.cuts) - 1
    lines += ["", "![measured vs requested](drops.png)", "", *cut_choice_lines(artifact), "## Patterns", "",
              f"Activation: the uploaded activation's bits and bytes per sample ({NONE}: the last cut "
              "uploads nothing). Weights: the head segment. Passed: the ladder's rungs that passed on "
              "the check samples before the first failure, of all its rungs. Check bound: the upper "
              f"confidence bound of the drop on the check samples ({NONE}: lossless, not checked).", "",
              "| cut | level | activation bits | activation | weights | of fp32 | predicted drop "
              "| passed | check bound | test drop |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_pattern_row(p, last) for p in artifact.patterns]
    lines += ["", "![payload vs level](payload.png)", "", "![bits](bits.png)", "",
              *_image_ladder(artifact),
              "## Noise tables and timing", "",
              "Wall time: " + "; ".join(f"{TIMINGS.get(k, k.replace('_', ' '))} {number(v)} s"
                                        for k, v in artifact.timing_s.items()
                                        if not k.startswith("peak_rss_mib_")) + ".", "",
              *_memory(artifact.timing_s),
              f"Additivity of the noise model: {_additivity(artifact.additivity_error)}.", "",
              "| level | noise budget D(a) |", "|---|---|"]
    lines += [f"| {level(float(a))} | {number(d)} |" for a, d in artifact.noise_budgets.items()]
    return "\n".join(lines) + "\n"


def _save(fig: Figure, path: Path) -> None:
    tmp = path.with_name(f"{path.stem}.tmp{path.suffix}")  # the suffix names the format
    try:
        fig.savefig(tmp, dpi=110)
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


def write_report(artifact: CalibrationArtifact, out_dir: Path) -> Path:
    """Write ``report.md`` and its plots into ``out_dir``; returns the report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _save(drops_figure(artifact), out_dir / "drops.png")
    _save(payload_figure(artifact), out_dir / "payload.png")
    _save(bits_figure(artifact), out_dir / "bits.png")
    report = out_dir / "report.md"
    write_atomic(report, markdown(artifact))
    return report


def write_outputs(artifact: CalibrationArtifact, agreement: dict[str, object], out_dir: Path) -> None:
    """Write ``report.md`` and its plots, ``validation.json``, then the artifact (``timing.json``,
    and ``artifact.json`` last) into ``out_dir``: each file atomically, so that an ``artifact.json``
    there is a whole one, written after everything it refers to."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_report(artifact, out_dir)
    doc = validation_doc(artifact, agreement)
    write_atomic(out_dir / "validation.json", json.dumps(doc, indent=1) + "\n")
    save_artifact(artifact, out_dir)


def main(folders: list[str]) -> None:
    """Draw the report of each saved artifact folder again (its ``artifact.json``), in place."""
    if not folders:
        raise SystemExit("usage: python -m qpart.offline.report ARTIFACT_DIR...")
    for folder in map(Path, folders):
        print(write_report(load_artifact(folder), folder))


if __name__ == "__main__":
    main(sys.argv[1:])
