"""Artifacts with the baselines' patterns: copies the server serves, which no demand admits."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from bench.e2e.config import DEMAND, EXTRA_LEVEL
from qpart.kernels import activation_group
from qpart.kernels.packing import packed_size
from qpart.profiles.artifacts import ARTIFACT_FILE, CalibrationArtifact, Pattern, load_artifact


def _act_bytes(artifact: CalibrationArtifact, cut: int, bits: int, group: int) -> int:
    if cut == len(artifact.cuts) - 1:
        return 0
    n = artifact.cuts[cut].activation_numel
    return 4 * n if bits >= 32 else packet_bytes(n, bits, group)


def packet_bytes(n: int, bits: int, group: int) -> int:
    """A quantized activation's codes and per-group scale and minimum, as patterns count
    ``activation_bytes`` (no packet header)."""
    return packed_size(n, bits) + 8 * (n // group)


def with_baselines(artifact: CalibrationArtifact) -> CalibrationArtifact:
    """The artifact plus uniform-int8 and QPART-as-published patterns at level 1.0."""
    extra = []
    by_cut = {p.cut: p for p in artifact.patterns if p.level == 0}
    for cut in artifact.cuts:
        if cut.index not in by_cut:  # a cut the calibration pruned (ADR 0025): baselines need its float head
            by_cut[cut.index] = _float_pattern(artifact, cut.index)
            extra.append(by_cut[cut.index])
        ref = by_cut[cut.index]
        act_bits = ref.activation_bits if cut.index == len(artifact.cuts) - 1 else 8
        extra.append(ref.model_copy(update={
            "pattern_id": f"u8-c{cut.index}", "level": EXTRA_LEVEL, "activation_bits": act_bits,
            "weight_bits": dict.fromkeys(cut.head_tensors, 8),
            "activation_bytes": _act_bytes(artifact, cut.index, act_bits, ref.group_size)}))
    for p in artifact.baseline_qpart_paper:
        if p.level == DEMAND:
            extra.append(p.model_copy(update={"pattern_id": f"paper-{p.pattern_id}", "level": EXTRA_LEVEL}))
    return artifact.model_copy(update={"patterns": [*artifact.patterns, *extra]})


FLOAT_ID = "float-c"
"""The id prefix of the float32 pattern added at a pruned cut, at :data:`EXTRA_LEVEL` (never planned)."""


def is_float(pattern: dict[str, Any]) -> bool:
    """Whether a listed pattern is a cut's float32 one: the calibration's lossless pattern (level 0),
    or the one :func:`with_baselines` adds at a cut the calibration pruned."""
    return pattern["level"] == 0 or str(pattern["pattern_id"]).startswith(FLOAT_ID)


def _float_pattern(artifact: CalibrationArtifact, cut: int) -> Pattern:
    """The lossless pattern a calibration of every cut would have written at ``cut``, at
    :data:`EXTRA_LEVEL` (the planner never offers it): the baselines, Neurosurgeon's float split and
    the autoencoder's head stay at every legal cut whichever cuts the calibration kept."""
    profile, last = artifact.cuts[cut], len(artifact.cuts) - 1
    largest = artifact.settings.get("activation_group", 256)
    group = activation_group(profile.activation_numel, largest if isinstance(largest, int) else 256)
    params = {t.name: t.params for t in artifact.tensors}
    weights = 4 * (profile.head_float_params + sum(params[n] for n in profile.head_tensors))
    return Pattern(pattern_id=f"{FLOAT_ID}{cut}", cut=cut, level=EXTRA_LEVEL,
                   weight_bits=dict.fromkeys(profile.head_tensors, 32), activation_bits=32, group_size=group,
                   predicted_noise=0.0, predicted_drop=0.0, calib_drop=None, calib_drop_ub=None,
                   test_drop=0.0,
                   weight_bytes=weights, fp32_weight_bytes=weights,
                   activation_bytes=0 if cut == last else 4 * profile.activation_numel)


def write_artifacts(source: Path, models: list[str], dest: Path) -> None:
    """Copies of the models' artifact folders with the baselines' patterns added."""
    for model in models:
        folder = dest / model
        folder.mkdir(parents=True)
        shutil.copy(source / model / "weights.safetensors", folder / "weights.safetensors")
        artifact = with_baselines(load_artifact(source / model))
        (folder / ARTIFACT_FILE).write_text(artifact.model_dump_json(indent=1))
