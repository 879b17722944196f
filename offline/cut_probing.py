"""The cut choice without probing every cut (ADR 0025): the same cuts kept, fewer probes.

:func:`offline.pruning.choose_cuts` prices every cut's predicted patterns, and predicting a pattern
means testing it on fit samples (``offline.selection.predicted_bits``): most of the choice's time
on a model with many cuts, spent mostly on cuts it then prunes. A pattern's objective never falls
when its bytes grow (``profiles.costs.price_terms``: bytes only add time and energy), so a cut's
patterns can cost no less than its *fewest-bytes* offers: every tensor and the activation at
``min_bits`` or float32, whichever is smaller. And the best plan of a request costs no more than
the best among the offers already known exactly (every cut's lossless one from the start, the
probed cuts' patterns as they come).

So a cut whose fewest-bytes offers stay beyond the margin of that known best at every request of
the envelope is pruned without a probe: its predicted patterns would be further still, and never
the best. The other cuts are probed, the most promising first (a tight known best prunes more).
Once no unprobed cut is left within reach, the best over the known offers is the best over all of
them (an unprobed cut's offers are all above it), so every probed cut's ratio, and the cuts kept,
are exactly those of :func:`~offline.pruning.choose_cuts` given every prediction;
``tests/offline/test_cut_probing.py`` checks it against that function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from qpart.offline.checkpoint import Checkpoints
from qpart.offline.errors import CheckpointMismatchError
from qpart.offline.patterns import fewest_sizes, sizes
from qpart.offline.pruning import Offer, choose_cuts, demand_masks, envelope, envelope_record, objectives
from qpart.offline.selection import Probe, predicted_bits
from qpart.offline.settings import CalibrationSettings
from qpart.offline.sizing import lossless_levels
from qpart.offline.state import State
from qpart.profiles import FLOAT_BITS, CutChoice, CutProfile

Predict = Callable[[int], list[Offer]]
"""A cut's predicted offers, one per level (what probing it costs)."""

Start = Callable[[str, int], Callable[[int], None]]
"""A progress sink's ``start(label, total)``, returning ``advance(done)``."""


class _Table:
    """Every offer's objective at every request of the envelope, and the (demand, runtime) masks
    :func:`~offline.pruning.closest` compares within, in its order."""

    def __init__(self, offers: list[Offer], cuts: Sequence[CutProfile], levels: Sequence[float],
                 s: CalibrationSettings) -> None:
        self.cuts, self.offers = cuts, offers
        self.requests = list(envelope(s))
        self.objective = np.stack([objectives(offers, cuts, r) for r in self.requests])
        self.cut_of = np.array([o.cut for o in offers])
        pairs = demand_masks(offers, cuts, levels)
        self.demands = [d for d, _ in pairs]
        self.masks = np.array([m for _, m in pairs])  # [masks, offers]

    def replace(self, new: list[Offer]) -> None:
        """Put a probed cut's offers (same cut and levels as the ones they replace) in the table."""
        index = [i for i, o in enumerate(self.offers) for n in new if (o.cut, o.level) == (n.cut, n.level)]
        for i, offer in zip(index, new, strict=True):
            self.offers[i] = offer
        for r, request in enumerate(self.requests):
            self.objective[r, index] = objectives(new, self.cuts, request)

    def ratios(self, known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per cut, the least ratio of its cheapest admissible offer to the best *known* admissible
        one over every (request, mask), and the first (request, mask) where it is least (flattened,
        request-major, as ``closest`` meets them); inf where no mask admits the cut."""
        n_cuts = len(self.cuts)
        best = np.stack([np.where(m & known, self.objective, np.inf).min(axis=1) for m in self.masks], 1)
        out, where = np.full(n_cuts, np.inf), np.zeros(n_cuts, dtype=int)
        for c in range(n_cuts):
            per = np.full(best.shape, np.inf)
            for j, mask in enumerate(self.masks):
                own = mask & (self.cut_of == c)
                if own.any():
                    per[:, j] = self.objective[:, own].min(axis=1) / best[:, j]
            flat = per.ravel()
            where[c] = int(np.argmin(flat))
            out[c] = flat[where[c]]
        return out, where

    def label(self, flat: int) -> str:
        r, j = divmod(flat, len(self.masks))
        return f"{self.requests[r].label}, demand {self.demands[j]:g}"


def choose_by_probing(cuts: Sequence[CutProfile], lossless: Sequence[Offer], fewest: Sequence[Offer],
                      probe: Predict, s: CalibrationSettings,
                      progress: Callable[[int], None] = lambda _: None) -> CutChoice:
    """``--cuts auto``'s choice (:func:`offline.pruning.choose_cuts`'s, cut for cut), probing only
    the cuts their fewest-bytes offers (``fewest``, one per cut and level) cannot rule out. Cut 0 is
    always kept, so it is probed first. ``progress`` gets the count of cuts probed."""
    offers = [o for c in cuts for o in [lossless[c.index], *[f for f in fewest if f.cut == c.index]]]
    table = _Table(offers, cuts, s.levels, s)
    known = np.array([o.level == 0.0 for o in offers])
    bar = 1.0 + s.envelope_margin
    pending, unprobed = [c.index for c in cuts], {}
    probed = 0
    while pending:
        ratio, where = table.ratios(known)
        for c in [c for c in pending if c != 0 and not ratio[c] <= bar]:
            pending.remove(c)
            unprobed[c] = (float(ratio[c]), table.label(int(where[c])) if math.isfinite(ratio[c]) else "")
        if not pending:
            break
        cut = 0 if 0 in pending else min(pending, key=lambda c: (ratio[c], c))
        pending.remove(cut)
        table.replace(probe(cut))
        known |= table.cut_of == cut
        probed += 1
        progress(probed)
    ratio, where = table.ratios(known)
    near = {c.index: (float(ratio[c.index]), table.label(int(where[c.index])) if math.isfinite(ratio[c.index])
                      else "") for c in cuts if c.index not in unprobed}
    kept = sorted({0} | {c for c, (r, _) in near.items() if r <= bar})
    pruned = {str(c): (f"at best {r:.3g}x the best plan's objective ({at}); the margin is {bar:.3g}x"
                       if math.isfinite(r) else "no runtime in the envelope is offered it")
              for c, (r, at) in near.items() if c not in kept}
    pruned |= {str(c): (f"at least {r:.3g}x the best plan's objective ({at}), even with every tensor and "
                        f"the activation at {s.min_bits} bits or float32 where smaller (not probed); the "
                        f"margin is {bar:.3g}x"
                        if math.isfinite(r) else "no runtime in the envelope is offered it")
               for c, (r, at) in unprobed.items()}
    in_order = dict(sorted(pruned.items(), key=lambda kv: int(kv[0])))
    return CutChoice(mode="envelope", calibrated=kept, pruned=in_order,
                     closest={str(c): round(r, 6) for c, (r, _) in sorted(near.items()) if math.isfinite(r)},
                     envelope=envelope_record(s))


def decide_cuts(st: State, profiles: list[CutProfile], budgets: dict[str, float], start: Start,
                ck: Checkpoints) -> CutChoice:
    """The job's choice: ``auto``'s by :func:`choose_by_probing`, from the patterns each probed
    (cut, level) is predicted to end with (read on fit samples only); ``all`` or named cuts as
    :func:`~offline.pruning.choose_cuts` says. Progress counts the cuts probed, of all of them (the
    ones pruned unprobed finish it). Checkpointed: the probes take a while, and a resumed job must
    make the same choice."""
    s = st.settings
    saved = ck.load("cut-choice")
    if saved is not None:
        choice = CutChoice.model_validate(saved)
        if 0 not in choice.calibrated or not set(choice.calibrated) <= {c.index for c in profiles}:
            raise CheckpointMismatchError(f"{ck.path('cut-choice')} names cuts {choice.calibrated}, not a "
                                          "choice of this model's cuts with cut 0; run again with --fresh")
        return choice
    if s.cuts != "auto":
        return choose_cuts([], profiles, s)
    probe, kept_lossless = Probe.of(st, s.envelope_probe_samples), lossless_levels(s)
    advance = start("choose cuts (cuts probed)", len(profiles))

    def offer(cut: int, level: float, bits: dict[str, int]) -> Offer:
        weight_bytes, _, activation_bytes = sizes(st.runner, cut, bits)
        return Offer(cut, level, weight_bytes, activation_bytes)

    def floats(cut: int) -> dict[str, int]:
        return {it.name: FLOAT_BITS for it in st.items[cut]}

    def predicted(cut: int) -> list[Offer]:
        return [offer(cut, level, floats(cut) if level in kept_lossless
                      else predicted_bits(st, cut, level, budgets[str(level)], probe)) for level in s.levels]

    def fewest(cut: int, level: float) -> Offer:
        if level in kept_lossless:  # float32 whatever the probe says
            return offer(cut, level, floats(cut))
        return Offer(cut, level, *fewest_sizes(st.runner, cut, s.min_bits))

    lossless = [offer(c.index, 0.0, floats(c.index)) for c in profiles]
    bounds = [fewest(c.index, level) for c in profiles for level in s.levels]
    choice = choose_by_probing(profiles, lossless, bounds, predicted, s, progress=advance)
    advance(len(profiles))
    ck.save("cut-choice", choice.model_dump(mode="json"))
    return choice
