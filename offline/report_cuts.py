"""The report's section on which cuts were calibrated and why the others were not (ADR 0025)."""

from __future__ import annotations

from qpart.profiles.artifacts import CalibrationArtifact

MODES = {
    "envelope": ("each cut's predicted patterns were priced by the planner's cost model over an envelope of "
                 "requests; a cut whose cheapest plan never came within the margin of the best plan was not "
                 "calibrated (`--cuts auto`, the default)"),
    "all": "every legal cut was calibrated (`--cuts all`)",
    "named": "the cuts `--cuts` named were calibrated, and cut 0 (the all-server plan)",
}


def cut_choice_lines(artifact: CalibrationArtifact) -> list[str]:
    """The ``## Cuts`` section of ``report.md``: calibrated cuts, the envelope, each pruned cut's reason."""
    choice = artifact.cut_choice
    if choice is None:
        return []
    lines = ["## Cuts", "",
             f"Calibrated: cuts {', '.join(map(str, choice.calibrated))} of {len(artifact.cuts)} legal cuts; "
             f"{MODES[choice.mode]}. A plan is only ever made at a calibrated cut.", ""]
    if choice.envelope is not None:
        shown = "; ".join(f"{k.replace('_', ' ')}: {_plain(v)}" for k, v in choice.envelope.items())
        lines += [f"Envelope: {shown}.", ""]
    if choice.pruned:
        lines += ["| cut | left out because |", "|---|---|"]
        ordered = sorted(choice.pruned.items(), key=lambda kv: int(kv[0]))
        lines += [f"| {cut} | {why} |" for cut, why in ordered]
        lines.append("")
    return lines


def _plain(value: object) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) \
        if isinstance(value, list) else (f"{value:g}" if isinstance(value, float) else str(value))
