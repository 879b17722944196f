"""Which cuts to calibrate: each cut's predicted patterns priced by the planner's cost model
(``profiles.costs``) over an envelope of requests; a cut no plan in the envelope would choose, or
come within the margin of, is not validated (ADR 0025).

The prediction (``offline.selection.predicted_bits``) is the allocation at each level's budget
``D(a)``, where Learn then Test's search starts, or one or two octaves below when that pattern fails
the level's test on a few fit samples, or float32 when those fail too: read from fit samples only,
before any check or test sample. Every figure it prices is a function of the model, the data and
the settings (FLOPs, bytes, the envelope), never a timing, so the decision is the same on any
machine, and a resumed job reads it from its checkpoint. The job predicts only the cuts a bound
cannot rule out (``offline.cut_probing``); :func:`choose_cuts` is the choice given every prediction,
which that module's result equals.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from qpart.kernels.onnx_format import HeadRuntime
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.settings import CalibrationSettings
from qpart.profiles import CutChoice, CutProfile
from qpart.profiles.costs import PRESET_WEIGHTS, PlanInputs, PresetWeights, price_terms
from qpart.profiles.devices import DeviceProfile, builtin_devices

OBJECTIVES = {**PRESET_WEIGHTS, "time-only": (1.0, 0.0, 0.0)}
"""The request presets, and time alone: what a request with a deadline ranks by (the most accurate plan
that meets it), approximated by the fastest plans."""

@dataclass(frozen=True)
class Offer:
    """A predicted pattern: where, at which level (0: lossless), and its bytes."""

    cut: int
    level: float
    weight_bytes: int
    activation_bytes: int


@dataclass(frozen=True)
class Request:
    """One request of the envelope, in words for the record, and its figures."""

    label: str
    inputs: PlanInputs
    server_flops: float
    held: bool


def envelope(s: CalibrationSettings) -> Iterator[Request]:
    """The requests the decision prices over: every device of the envelope at every speed, every
    rate, every objective preset, every server speed, with and without the head segment held."""
    devices = _devices(s.envelope_devices)
    lo, hi = s.envelope_rates_mbps
    points = s.envelope_rate_points
    rates = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)] if points > 1 else [lo]
    grid = itertools.product(devices, s.envelope_speeds, rates, sorted(OBJECTIVES), s.envelope_server_flops,
                             (False, True))
    for device, speed, rate, preset, server, held in grid:
        fast = device.model_copy(update={"flops_per_s": device.flops_per_s * speed})
        inputs = PlanInputs(fast, PresetWeights(*OBJECTIVES[preset]), rate * 1e6, device.rtt_s, 1,
                            s.envelope_price, frozenset())
        label = (f"{device.name} at {speed:g}x, {rate:.3g} Mbit/s, {preset}, server {server:.2g} FLOP/s, "
                 f"segment {'held' if held else 'downloaded'}")
        yield Request(label, inputs, server, held)


def _devices(names: Sequence[str]) -> list[DeviceProfile]:
    """The shipped profiles named (the settings checked the names), or all of them."""
    shipped = builtin_devices()
    return [shipped[n] for n in names] if names else list(shipped.values())


def objectives(offers: Sequence[Offer], cuts: Sequence[CutProfile], request: Request) -> np.ndarray:
    last = len(cuts) - 1
    out = np.empty(len(offers))
    for i, o in enumerate(offers):
        cut = cuts[o.cut]
        out[i] = price_terms(
            request.inputs, head_flops=cut.head_flops, last=o.cut == last,
            local_s=cut.head_flops / request.inputs.device.flops_per_s,
            segment_bytes=0 if request.held or o.cut == 0 else o.weight_bytes,
            activation_bytes=o.activation_bytes, answer_bytes=0, header_bytes=0,
            tail_s=cut.tail_flops / request.server_flops, decode_s=0.0).objective
    return out


def closest(offers: Sequence[Offer], cuts: Sequence[CutProfile], levels: Sequence[float],
            s: CalibrationSettings) -> dict[int, tuple[float, str]]:
    """Per cut, the least ratio of its cheapest admissible offer's objective to the best plan's, over
    the envelope's requests, demands (each level, and lossless) and device runtimes (a runtime is
    never offered a cut it refuses), with the request where it was least."""
    found: dict[int, tuple[float, str]] = {c.index: (math.inf, "") for c in cuts}
    cut_of = np.array([o.cut for o in offers])
    masks = demand_masks(offers, cuts, levels)
    for request in envelope(s):
        objective = objectives(offers, cuts, request)
        for demand, mask in masks:
            best = objective[mask].min()
            for cut in np.unique(cut_of[mask]):
                ratio = float(objective[mask & (cut_of == cut)].min() / best)
                if ratio < found[int(cut)][0]:
                    found[int(cut)] = (ratio, f"{request.label}, demand {demand:g}")
    return found


def demand_masks(offers: Sequence[Offer], cuts: Sequence[CutProfile],
                 levels: Sequence[float]) -> list[tuple[float, np.ndarray]]:
    """The offers each demand (lossless, then each level) admits for each device runtime (without
    the cuts it refuses; runtimes that refuse the same cuts once), in the order :func:`closest`
    compares within."""
    levels_of = np.array([o.level for o in offers])
    runtimes = [np.array([r.value not in cuts[o.cut].runtimes_refused for o in offers])
                for r in HeadRuntime]
    return [(demand, (levels_of <= demand) & runtime)
            for demand in (0.0, *levels) for runtime in distinct_masks(runtimes)]


def distinct_masks(masks: list[np.ndarray]) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for m in masks:
        if not any(np.array_equal(m, o) for o in out):
            out.append(m)
    return out


def choose_cuts(offers: Sequence[Offer], cuts: Sequence[CutProfile], s: CalibrationSettings) -> CutChoice:
    """The cuts to calibrate, as the settings say: ``all``; the named ones (and cut 0, the
    all-server plan every answer compares with); or (``auto``) those whose closest approach to the
    best plan is within ``envelope_margin``, and cut 0.

    Raises:
        CalibrationConfigError: a named cut does not exist (the settings refuse an unknown device).
    """
    legal = [c.index for c in cuts]
    if s.cuts == "all":
        return CutChoice(mode="all", calibrated=legal)
    if s.cuts != "auto":
        check_named_cuts(s.cuts, len(cuts))
        kept = sorted({0, *s.cuts})
        return CutChoice(mode="named", calibrated=kept,
                         pruned={str(c): "not named by --cuts" for c in legal if c not in kept})
    near = closest(offers, cuts, s.levels, s)
    bar = 1.0 + s.envelope_margin
    kept = sorted({0} | {c for c, (ratio, _) in near.items() if ratio <= bar})
    pruned = {str(c): (f"at best {ratio:.3g}x the best plan's objective ({where}); the margin is "
                       f"{bar:.3g}x" if math.isfinite(ratio) else "no runtime in the envelope is offered it")
              for c, (ratio, where) in near.items() if c not in kept}
    return CutChoice(mode="envelope", calibrated=kept, pruned=pruned,
                     closest={str(c): round(r, 6) for c, (r, _) in near.items() if math.isfinite(r)},
                     envelope=envelope_record(s))


def check_named_cuts(named: Sequence[int], legal: int) -> None:
    """Refuse (one line) a cut index the model does not have."""
    missing = sorted(c for c in named if not 0 <= c < legal)
    if missing:
        raise CalibrationConfigError(
            f"--cuts names cut {', '.join(map(str, missing))}, which this model does not have: its cuts "
            f"are 0 to {legal - 1} (qpart models lists each model's cut count); or pass --cuts all or auto")


def envelope_record(s: CalibrationSettings) -> dict[str, object]:
    """The envelope and margin as the artifact records them."""
    return {"margin": s.envelope_margin, "devices": list(s.envelope_devices) or sorted(builtin_devices()),
            "speeds": list(s.envelope_speeds), "rates_mbps": list(s.envelope_rates_mbps),
            "rate_points": s.envelope_rate_points, "server_flops": list(s.envelope_server_flops),
            "price_per_second": s.envelope_price, "objectives": sorted(OBJECTIVES),
            "probe_samples": s.envelope_probe_samples,
            "segments": ["downloaded", "held"], "batch": 1}
