"""How far each cut's activation packets shrink under the upload codings (``kernels.coding``).

The planner prices an upload that a device sends with ``Content-Encoding: deflate`` or ``zstd`` at
the raw packet size times the cut's :attr:`profiles.artifacts.CutProfile.coding_ratio` of that
coding and the packet's bits. The ratios are measured
here, on calibration samples (never the test split): the float head's
activation at the cut, quantized with each bit width (1..8) and the cut's group size, or sent as
float32, one packet per sample as devices send them; the ratio is the coded bytes over the raw
bytes, summed over the samples (so ``ratio * raw size`` is the mean coded size).

The heads that patterns run have quantized weights, whose activations differ slightly from the
float head's; the ratio is measured once per (cut, bits), not per pattern.

``calibrate`` measures it for new artifacts; ``qpart measure-coding`` adds it to an existing one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from qpart.kernels.coding import CODING_BITS, Coding, encode
from qpart.kernels.wire import encode_float_activation, encode_quantized_activation
from qpart.models.data import Split, load_split
from qpart.models.registry import ModelSpec, get_model
from qpart.offline.data import recorded_source
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.runner import ModelRunner
from qpart.offline.samples import read_samples
from qpart.profiles.artifacts import FLOAT_BITS, CalibrationArtifact, load_artifact, save_artifact

CODING_SAMPLES = 500


CodingRatios = dict[Coding, list[dict[int, float]]]  # per coding, per cut, per bits


def coding_ratios(runner: ModelRunner, images: np.ndarray,
                  advance: Callable[[int], None] | None = None) -> CodingRatios:
    """Per coding, per cut, per bits: coded over raw packet bytes on ``images`` (the last cut:
    empty, it uploads nothing)."""
    out: CodingRatios = {coding: [] for coding in Coding}
    for cut in runner.cuts:
        if advance:
            advance(cut.index)
        if cut.index == len(runner.cuts) - 1:
            for per_cut in out.values():
                per_cut.append({})
            continue
        acts = runner.head_outputs(images, cut.index).numpy()
        raw = dict.fromkeys(CODING_BITS, 0)
        coded = {coding: dict.fromkeys(CODING_BITS, 0) for coding in Coding}
        for bits in CODING_BITS:
            for act in acts:
                packet = (encode_float_activation(act[None]) if bits >= FLOAT_BITS
                          else encode_quantized_activation(act[None], bits, runner.groups[cut.index]))
                raw[bits] += len(packet)
                for coding in Coding:
                    coded[coding][bits] += len(encode(packet, coding))
        for coding in Coding:
            out[coding].append({bits: coded[coding][bits] / raw[bits] for bits in CODING_BITS})
    if advance:
        advance(len(runner.cuts))
    return out


def with_coding_ratios(artifact: CalibrationArtifact, ratios: CodingRatios) -> CalibrationArtifact:
    """``artifact`` with each cut's measured ratios of every coding.

    Raises:
        CalibrationConfigError: a coding's ratios are not one per cut of the artifact.
    """
    for coding, per_cut in ratios.items():
        if len(per_cut) != len(artifact.cuts):
            raise CalibrationConfigError(f"{len(per_cut)} {coding.value} ratios for an artifact of "
                                         f"{len(artifact.cuts)} cuts")
    cuts = [c.with_coding_ratios({coding: per_cut[c.index] for coding, per_cut in ratios.items()})
            for c in artifact.cuts]
    return artifact.model_copy(update={"cuts": cuts})


def _fit_images(artifact: CalibrationArtifact, spec: ModelSpec, data: str | None, start: int,
                samples: int) -> np.ndarray:
    """The calibration samples ``start .. start + samples`` of the artifact's fit range, from the
    source it records, reopened and checked against its content digest."""
    record = artifact.data
    if record is None:  # calibrated before data records: always the built-in split, in its order
        return load_split(Split.CALIBRATION).images[start : start + samples]
    source = recorded_source(artifact, spec, "calibration", data)
    return read_samples(source, start + samples, record.sample_order, Split.CALIBRATION).images[start:]


def measure_artifact(directory: Path, samples: int = CODING_SAMPLES,
                     advance: Callable[[int], None] | None = None,
                     data: str | None = None) -> CalibrationArtifact:
    """Measure the ratios for the artifact in ``directory`` (its own weights, the first ``samples``
    calibration samples of its fit range) and rewrite its ``artifact.json``.

    Args:
        data: where the calibration data is now, as ``qpart calibrate --data`` named it (default:
            where the artifact records it was read). For a source the calibration split into
            calibration and test samples, the source before the split. It must hold the recorded
            content (digest), or it is refused.
    """
    artifact = load_artifact(directory)
    use = artifact.splits.get("calibration_use")
    fit = use.get("fit") if isinstance(use, dict) else None
    if not (isinstance(fit, list) and len(fit) == 2 and all(isinstance(v, int) for v in fit)):
        raise CalibrationConfigError(f"{directory}: the artifact does not record its fit samples")
    fit_start, fit_stop = fit
    if samples > fit_stop - fit_start:
        raise CalibrationConfigError(f"{samples} samples asked; the artifact's fit range holds "
                                     f"{fit_stop - fit_start}")
    spec = replace(get_model(artifact.model), weights=directory / "weights.safetensors")
    largest = artifact.settings.get("activation_group")
    if not isinstance(largest, int):
        raise CalibrationConfigError(f"{directory}: the artifact does not record its activation group")
    if hashlib.sha256(spec.weights.read_bytes()).hexdigest() != artifact.weights_sha256:
        raise CalibrationConfigError(f"{directory}: weights.safetensors is not the artifact's (sha256)")
    runner = ModelRunner(spec.load(), spec.input_shape, largest_group=largest)
    groups = {(p.cut, p.group_size) for p in [*artifact.patterns, *artifact.baseline_qpart_paper]}
    if any(runner.groups[cut] != group for cut, group in groups):
        raise CalibrationConfigError("the artifact's group sizes differ from the runner's")
    images = _fit_images(artifact, spec, data, fit_start, samples)
    measured = with_coding_ratios(artifact, coding_ratios(runner, images, advance))
    save_artifact(measured, directory)
    return measured
