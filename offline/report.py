"""Outputs of the calibration job: ``artifact.json``, ``validation.json``, ``report.md`` + PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: the job runs on servers and in CI
import matplotlib.pyplot as plt
import numpy as np

from profiles.artifacts import CalibrationArtifact, Pattern, save_artifact


def _row(p: Pattern) -> dict[str, object]:
    return {"cut": p.cut, "level": p.level, "predicted_drop": p.predicted_drop, "test_drop": p.test_drop,
            "weight_bytes": p.weight_bytes, "fp32_weight_bytes": p.fp32_weight_bytes,
            "activation_bits": p.activation_bits, "calib_drop": p.calib_drop,
            "calib_drop_ub": p.calib_drop_ub, "weight_bits": p.weight_bits,
            "activation_bytes": p.activation_bytes, "tightenings": p.tightenings}


def _violations(patterns: list[Pattern]) -> dict[str, object]:
    graded = [p for p in patterns if p.level > 0 and p.test_drop is not None]
    margins = [p.level - p.test_drop for p in graded if p.test_drop is not None]
    return {"patterns": len(graded), "violations": sum(m < 0 for m in margins),
            "tightest_margin": min(margins) if margins else None}


def validation_doc(artifact: CalibrationArtifact, agreement: dict[str, object]) -> dict[str, object]:
    """The ``validation.json`` document (drops as fractions)."""
    graded = [p for p in artifact.patterns if p.level > 0]
    return {
        "model": artifact.model, "version": artifact.version, "levels": artifact.settings["levels"],
        "fp32_test_accuracy": artifact.fp32_test_accuracy,
        "patterns": [_row(p) for p in graded],
        "baseline_qpart_paper": [_row(p) for p in artifact.baseline_qpart_paper],
        "summary": {"qpart": _violations(graded),
                    "baseline_qpart_paper": _violations(artifact.baseline_qpart_paper)},
        "timing_s": {"direct": artifact.timing_s.get("direct"), "fast": artifact.timing_s.get("fast"),
                     **artifact.timing_s},
        "additivity_error": artifact.additivity_error,
        "estimator_agreement": agreement,
    }


def _plot_drops(artifact: CalibrationArtifact, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, pats, marker in (("validated (ours)", artifact.patterns, "o"),
                                ("QPART as published", artifact.baseline_qpart_paper, "x")):
        pts = [(p.level, p.test_drop) for p in pats if p.level > 0 and p.test_drop is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.scatter(np.array(xs) * 100, np.array(ys) * 100, marker=marker, label=label, alpha=0.7)
    levels = np.array(artifact.settings["levels"], dtype=float) * 100
    ax.plot(levels, levels, "k--", label="requested")
    ax.set_xscale("log")
    ax.set_xlabel("requested max drop (%)")
    ax.set_ylabel("measured test drop (%)")
    ax.legend()
    ax.set_title(f"{artifact.model}: measured vs requested degradation")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_payload(artifact: CalibrationArtifact, path: Path) -> None:
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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_bits(artifact: CalibrationArtifact, path: Path) -> None:
    names = [t.name for t in artifact.tensors] + ["activation"]
    rows = [p for p in artifact.patterns if p.level > 0]
    grid = np.full((len(rows), len(names)), np.nan)
    for i, p in enumerate(rows):
        for j, name in enumerate(names[:-1]):
            if name in p.weight_bits:
                grid[i, j] = min(p.weight_bits[name], 16)
        if p.cut < len(artifact.cuts) - 1:
            grid[i, -1] = min(p.activation_bits, 16)
    fig, ax = plt.subplots(figsize=(1 + 0.5 * len(names), 1 + 0.18 * len(rows)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=1, vmax=16)
    ax.set_xticks(range(len(names)), names, rotation=70, fontsize=7)
    ax.set_yticks(range(len(rows)), [f"cut {p.cut} @ {p.level:.2%}" for p in rows], fontsize=6)
    fig.colorbar(im, ax=ax, label="bits (16 = float)")
    ax.set_title(f"{artifact.model}: bits per layer")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _markdown(artifact: CalibrationArtifact, doc: dict[str, object]) -> str:
    s = doc["summary"]
    assert isinstance(s, dict)
    lines = [
        f"# Calibration report: {artifact.model} (version {artifact.version})", "",
        f"fp32 test accuracy {artifact.fp32_test_accuracy:.4f}. Levels {artifact.settings['levels']}.",
        f"Calibration samples used: {artifact.splits['calibration_use']}; "
        "test = the official t10k images, read once per final pattern.",
        "", "## Promise kept on the test split", "",
        "| method | patterns | violations (test_drop > level) | tightest margin |", "|---|---|---|---|",
    ]
    for name in ("qpart", "baseline_qpart_paper"):
        v = s[name]
        lines.append(f"| {name} | {v['patterns']} | {v['violations']} | {v['tightest_margin']} |")
    lines += ["", "![measured vs requested](drops.png)", "", "## Patterns", "",
              "| cut | level | act bits | weight KiB | % of fp32 | predicted | check UB | test drop |",
              "|---|---|---|---|---|---|---|---|"]
    for p in artifact.patterns:
        pct = 100 * p.weight_bytes / p.fp32_weight_bytes if p.fp32_weight_bytes else 0.0
        lines.append(f"| {p.cut} | {p.level:.4f} | {p.activation_bits} | {p.weight_bytes / 1024:.1f} | "
                     f"{pct:.2f} | {p.predicted_drop:.4f} | {p.calib_drop_ub} | {p.test_drop} |")
    lines += ["", "![payload vs level](payload.png)", "", "![bits](bits.png)", "",
              "## Noise tables and timing", "",
              f"Wall time (s): {json.dumps(artifact.timing_s)}", "",
              f"Additivity (predicted / measured total noise of mixed patterns): "
              f"{json.dumps(artifact.additivity_error)}", "",
              f"Noise budgets D(a): {json.dumps(artifact.noise_budgets)}", ""]
    return "\n".join(lines)


def write_outputs(artifact: CalibrationArtifact, agreement: dict[str, object], out_dir: Path) -> None:
    """Write the artifact, ``validation.json``, ``report.md`` and its plots into ``out_dir``."""
    save_artifact(artifact, out_dir)
    doc = validation_doc(artifact, agreement)
    tmp = out_dir / "validation.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out_dir / "validation.json")
    _plot_drops(artifact, out_dir / "drops.png")
    _plot_payload(artifact, out_dir / "payload.png")
    _plot_bits(artifact, out_dir / "bits.png")
    (out_dir / "report.md").write_text(_markdown(artifact, doc))
