"""The planner: QPART's cost model (docs/cost-model.md) over the precomputed (cut, level) patterns.

For a fixed (cut, level) every bit-dependent term is proportional to the bits sent, so the
bit pattern that minimises ``J`` does not depend on rate or weights: planning is an
enumeration of cuts × levels no looser than the demand, each priced with the request's numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from qpart.kernels.coding import Coding
from qpart.profiles.artifacts import FLOAT_BITS, CalibrationArtifact, CutProfile, Pattern
from qpart.profiles.costs import PlanInputs, price_terms
from qpart.profiles.devices import DeviceProfile
from qpart.server.errors import UnprocessableError
from qpart.server.schemas import CostBreakdown, EnergyBreakdown, TimeBreakdown


@dataclass(frozen=True)
class Candidate:
    """A pattern with its segment and its predicted costs for this request."""

    pattern: Pattern
    segment_id: str | None
    segment_bytes: int
    costs: CostBreakdown


def coding_header_bytes(coding: str) -> int:
    """What an upload in ``coding`` adds to :data:`HTTP_EXCHANGE_BYTES`: its header field."""
    return len(f"Content-Encoding: {coding}\r\n")


def head_seconds(artifact: CalibrationArtifact, cut: CutProfile, device: DeviceProfile) -> float:
    """Device head time: measured by the device's profiler when it has this version, else FLOPs."""
    measured = device.measured.get(artifact.model)
    if measured is not None and measured.version == artifact.version and cut.index < len(measured.head_s):
        return measured.head_s[cut.index]
    return cut.head_flops / device.flops_per_s


def encode_seconds(artifact: CalibrationArtifact, pattern: Pattern, device: DeviceProfile) -> float:
    """Device time to quantize and pack the activation: measured when the profile has it, else 0
    (a float32 activation is sent as is)."""
    measured = device.measured.get(artifact.model)
    if (pattern.activation_bits >= 32 or measured is None or measured.version != artifact.version
            or pattern.cut >= len(measured.encode_s)):
        return 0.0
    return measured.encode_s[pattern.cut]


def coding_seconds(artifact: CalibrationArtifact, pattern: Pattern, device: DeviceProfile,
                   coding: Coding) -> float | None:
    """Device time to compress one sample's upload in ``coding``, as the device measured it for
    this cut and bits; None when its profile has no such figure for this version (the upload is
    then not sent in that coding)."""
    measured = device.measured.get(artifact.model)
    if measured is None or measured.version != artifact.version:
        return None
    times = measured.coding_s.get(coding, [])
    if pattern.cut >= len(times):
        return None
    return times[pattern.cut].get(pattern.activation_bits)


def price_options(artifact: CalibrationArtifact, pattern: Pattern, segment_id: str | None,
                  segment_bytes: int, inputs: PlanInputs, tail_s: float | None = None,
                  answer_bytes: int = 0, decode_s: Mapping[str, float] | None = None) -> list[CostBreakdown]:
    """The pattern priced with its activation sent as is, and also in each coding the device offers
    (``inputs.upload_codings``: deflate, zstd) for which the calibration measured how far this
    cut's packets at these bits shrink (``CutProfile.coding_ratio``, below 1) and the device's
    profile says how long compressing takes (``MeasuredHeads.coding_s``). See
    :func:`price_upload`. ``decode_s``: per coding (``identity`` for a body sent as is), the server's
    seconds decoding one sample's packet (:mod:`server.tails.decode_times`); a coding it lacks costs 0."""
    decode = decode_s or {}
    options = [price_upload(artifact, pattern, segment_id, segment_bytes, inputs, tail_s, answer_bytes,
                            decode_s=decode.get("identity", 0.0))]
    if pattern.cut == len(artifact.cuts) - 1:
        return options
    for coding in sorted(inputs.upload_codings):
        ratio = artifact.cuts[pattern.cut].coding_ratio.get(coding, {}).get(pattern.activation_bits)
        t_code = coding_seconds(artifact, pattern, inputs.device, coding)
        if ratio is not None and ratio < 1 and t_code is not None:
            options.append(price_upload(artifact, pattern, segment_id, segment_bytes, inputs, tail_s,
                                        answer_bytes, ratio=ratio, extra_local_s=t_code, coding=coding,
                                        decode_s=decode.get(coding, 0.0)))
    return options


def price(artifact: CalibrationArtifact, pattern: Pattern, segment_id: str | None,
          segment_bytes: int, inputs: PlanInputs, tail_s: float | None = None,
          answer_bytes: int = 0, decode_s: Mapping[str, float] | None = None) -> CostBreakdown:
    """The cheaper (by objective) of :func:`price_options`."""
    return min(price_options(artifact, pattern, segment_id, segment_bytes, inputs, tail_s, answer_bytes,
                             decode_s), key=lambda c: c.objective)


def price_upload(artifact: CalibrationArtifact, pattern: Pattern, segment_id: str | None,
                 segment_bytes: int, inputs: PlanInputs, tail_s: float | None = None,
                 answer_bytes: int = 0, *, ratio: float | None = None,
                 extra_local_s: float = 0.0, coding: Coding | None = None,
                 decode_s: float = 0.0) -> CostBreakdown:
    """Predicted time, energy, server cost and objective of one pattern for one request.

    ``tail_s`` is the tail's batch-1 time on the serving machine (default: the artifact's figure,
    measured where the calibration ran); ``answer_bytes`` the size of the tail's answer per
    sample; ``decode_s`` the server's time decoding one sample's packet (its coding undone,
    dequantized), server time beside the tail. Each HTTP exchange (segment download, activation
    upload) costs one round trip and :data:`HTTP_EXCHANGE_BYTES` of headers and framing.

    The activation's upload time counts only past ``inputs.upload_overlap_s``: the server parses a
    request's headers and dispatches it while the body is still on the wire, work the round trip
    (probed with a tiny body) already holds; the device measures it on its link (ADR 0004).
    With ``inputs.upload_rate_bps`` the activation body's bytes cost time at that rate (ADR 0006).

    With ``ratio`` the activation is sent in ``coding`` (deflate or zstd; each needs the other):
    priced at its raw size times the ratio (the calibration's mean, measured on one-sample packets:
    a batch is priced as that many samples), plus the coding's header field
    (:func:`coding_header_bytes`), and ``extra_local_s`` (the device's compression time) per sample.
    """
    if (ratio is None) != (coding is None):
        raise TypeError("price_upload: a coded upload needs both its ratio and its coding")
    cut = artifact.cuts[pattern.cut]
    last = pattern.cut == len(artifact.cuts) - 1
    local_s = (head_seconds(artifact, cut, inputs.device)
               + (0.0 if last else encode_seconds(artifact, pattern, inputs.device) + extra_local_s))
    held = segment_id is not None and segment_id in inputs.held
    terms = price_terms(
        inputs, head_flops=cut.head_flops, last=last, local_s=local_s,
        segment_bytes=0 if held or segment_id is None else segment_bytes,
        activation_bytes=pattern.activation_bytes * (1.0 if ratio is None else ratio),
        answer_bytes=answer_bytes, header_bytes=0 if coding is None else coding_header_bytes(coding),
        tail_s=cut.server_tail_s if tail_s is None else tail_s, decode_s=decode_s)
    total_t = terms.local_s + terms.transfer_s + terms.server_s
    return CostBreakdown(
        time_s=TimeBreakdown(local=terms.local_s, transfer=terms.transfer_s, server=terms.server_s,
                             total=total_t),
        energy_j=EnergyBreakdown(local=terms.local_j, transfer=terms.transfer_j,
                                 total=terms.local_j + terms.transfer_j),
        server_cost=terms.server_cost, objective=terms.objective, transfer_bytes=round(terms.sent_bytes),
        upload_encoding="identity" if coding is None else coding,
    )


def image_pattern(artifact: CalibrationArtifact, pattern_id: str, image_bytes: int, *, level: float = 0.0,
                  test_drop: float | None = None) -> Pattern:
    """An input-image plan as a pattern: cut 0 (the server preprocesses the device's own image as
    the card declares), no head segment, ``image_bytes`` uploaded. The PNG (ADR 0014) is lossless,
    level 0; a WebP (ADR 0015) has its quality's promised ``level`` and measured ``test_drop``."""
    return Pattern(pattern_id=pattern_id, cut=0, level=level, weight_bits={}, activation_bits=8,
                   group_size=1, predicted_noise=0.0, predicted_drop=0.0, calib_drop=None,
                   calib_drop_ub=None, test_drop=test_drop, weight_bytes=0, fp32_weight_bytes=0,
                   activation_bytes=image_bytes)


def price_image(artifact: CalibrationArtifact, pattern: Pattern, encode_s: float, inputs: PlanInputs,
                server_s: float, answer_bytes: int = 0) -> CostBreakdown:
    """An input-image plan priced as :func:`price_upload` prices cut 0: the device's time is its
    own figure for encoding the image (no head, no quantization), the upload the image's bytes, the
    server's time ``server_s`` (decoding and preprocessing, then the whole model)."""
    device = inputs.device.model_copy(update={"measured": {}})  # no measured head or encode at cut 0
    return price_upload(artifact, pattern, None, 0, replace(inputs, device=device, audit_bytes=0.0),
                        server_s, answer_bytes, extra_local_s=encode_s)  # an image plan is not audited


def allowed_patterns(artifact: CalibrationArtifact, demand: float) -> list[Pattern]:
    """Patterns whose level is no looser than the demand; lossless ones (level 0) always qualify."""
    return [p for p in artifact.patterns if p.level <= demand]


def only_lossless(candidates: list[Candidate]) -> bool:
    """Whether every plan at the demand sends float32: each candidate is lossless (level 0) or
    quantizes nothing (a level the calibration could not certify, kept float32:
    ``CalibrationArtifact.lossless_levels``). The plan then says ``lossless: true``."""
    return all(c.pattern.level == 0 or (c.pattern.activation_bits >= FLOAT_BITS and all(
        b >= FLOAT_BITS for b in c.pattern.weight_bits.values())) for c in candidates)


def choose(candidates: list[Candidate], deadline_s: float | None) -> Candidate:
    """Smallest objective; with a deadline, the most accurate plan that meets it.

    Raises:
        UnprocessableError: no candidate meets the deadline (the message names the fastest time).
    """
    candidates = [c for c in candidates if math.isfinite(c.costs.objective)]
    if not candidates:
        raise UnprocessableError("the request's figures make every plan's cost infinite; check the "
                                 "rate, the device profile and the objective weights")
    if deadline_s is None:
        return min(candidates, key=lambda c: (c.costs.objective, c.pattern.level, c.pattern.cut))
    meeting = [c for c in candidates if c.costs.time_s.total <= deadline_s]
    if not meeting:
        fastest = min(candidates, key=lambda c: c.costs.time_s.total)
        raise UnprocessableError(
            f"no plan meets the deadline of {deadline_s:.4f} s; the fastest achievable is "
            f"{fastest.costs.time_s.total:.4f} s (cut {fastest.pattern.cut}, level "
            f"{fastest.pattern.level}); relax the deadline or the accuracy demand")
    return min(meeting, key=lambda c: (c.pattern.level, c.costs.objective))


def best_at_cut(candidates: list[Candidate], cut: int) -> Candidate | None:
    """The cheapest candidate at one cut (for the all-server / all-device comparisons); None where
    no candidate is at that cut (the device's runtime cannot run its head, ADR 0019)."""
    return min((c for c in candidates if c.pattern.cut == cut), key=lambda c: c.costs.objective, default=None)
