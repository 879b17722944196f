"""The cut choice that probes only the cuts it cannot rule out (offline.cut_probing): the cuts kept
and every probed cut's ratio equal choose_cuts' given every prediction, with fewer probes."""

from __future__ import annotations

import numpy as np
import pytest

from qpart.offline.cut_probing import choose_by_probing
from qpart.offline.pruning import Offer, choose_cuts
from qpart.offline.settings import CalibrationSettings
from qpart.profiles import load_artifact

LEVELS = (0.005, 0.01, 0.02)


@pytest.fixture(scope="module")
def cuts(every_cut):
    """fmnist-cnn's nine cuts: their FLOPs, sizes and runtime refusals."""
    return load_artifact(every_cut / "fmnist-cnn").cuts


def _case(cuts, seed, shrink=16, near=0.0):
    """Lossless offers (float bytes); the fewest bytes (float over ``shrink``); predictions between
    them, or (``near``) between that fraction of float and float."""
    rng = np.random.default_rng(seed)
    lossless, predicted, fewest = [], {}, []
    for c in cuts:
        act = 0 if c.index == len(cuts) - 1 else 4 * c.activation_numel
        weights = 4 * (c.head_float_params + int(rng.integers(1_000, 400_000))) * (c.index > 0)
        lossless.append(Offer(c.index, 0.0, weights, act))
        low_w, low_a = weights // shrink, act // shrink
        fewest += [Offer(c.index, level, low_w, low_a) for level in LEVELS]
        from_w, from_a = max(low_w, int(near * weights)), max(low_a, int(near * act))
        predicted[c.index] = [Offer(c.index, level, int(rng.integers(from_w, weights + 1)),
                                    int(rng.integers(from_a, act + 1))) for level in LEVELS]
    return lossless, predicted, fewest


def _refusing(cuts, seed):
    """Some cuts refused to the ONNX runtime (priced without them for ONNX devices)."""
    rng = np.random.default_rng(seed)
    return [c.model_copy(update={"runtimes_refused": {"onnx": "no"}}) if c.index and rng.random() < 0.3
            else c for c in cuts]


def _compare(cuts, s, lossless, predicted, fewest):
    """choose_by_probing against choose_cuts on every prediction: the probed cuts, the ones pruned
    unprobed, and the ones probed then pruned."""
    every = [o for c in cuts for o in [lossless[c.index], *predicted[c.index]]]
    reference = choose_cuts(every, cuts, s)
    probed: list[int] = []

    def probe(cut):
        probed.append(cut)
        return predicted[cut]

    choice = choose_by_probing(cuts, lossless, fewest, probe, s)
    assert choice.calibrated == reference.calibrated
    assert probed[0] == 0 and len(set(probed)) == len(probed) and set(choice.calibrated) <= set(probed)
    for cut, ratio in choice.closest.items():  # the probed cuts: exactly the reference's ratio and reason
        assert ratio == reference.closest[cut]
        if cut in choice.pruned:
            assert choice.pruned[cut] == reference.pruned[cut]
    unprobed = {str(c.index) for c in cuts} - {str(c) for c in probed}
    assert set(choice.pruned) == set(reference.pruned) and unprobed <= set(choice.pruned)
    for cut in unprobed:  # the bound it was pruned by is no higher than its ratio when probed
        assert "not probed" in choice.pruned[cut] and cut not in choice.closest
        bound = float(choice.pruned[cut].removeprefix("at least ").split("x ")[0])
        assert bound <= float(f"{reference.closest[cut]:.3g}")  # both as the reason rounds them
    return {str(c) for c in probed} & set(choice.pruned), unprobed


def test_the_choice_equals_pricing_every_prediction_with_fewer_probes(cuts):
    probed_then_pruned, pruned_unprobed, refused = set(), set(), 0
    for seed in range(8):
        for margin in (0.0, 0.02, 0.2):
            for shrink, near in ((16, 0.0), (2, 0.0), (50, 0.6)):
                s = CalibrationSettings(levels=LEVELS, envelope_margin=margin, envelope_rate_points=5,
                                        envelope_speeds=(0.3, 3.0))
                case = _refusing(cuts, seed) if seed % 2 else cuts
                refused += sum(bool(c.runtimes_refused) for c in case)
                a, b = _compare(case, s, *_case(case, seed, shrink, near))
                probed_then_pruned |= {(seed, margin, shrink, c) for c in a}
                pruned_unprobed |= {(seed, margin, shrink, c) for c in b}
    # the cases reach every path: cuts probed and then pruned, cuts never probed, ONNX refusals
    assert probed_then_pruned and pruned_unprobed and refused


def test_a_cut_whose_fewest_bytes_still_lose_is_never_probed(cuts):
    s = CalibrationSettings(levels=LEVELS)
    lossless, predicted, fewest = _case(cuts, 0)
    # cut 4 computes and downloads more than cut 3 and uploads a thousand times its float bytes
    # even at the fewest: beyond the margin everywhere
    big = [Offer(4, o.level, 10**9, 10**9) for o in fewest if o.cut == 4]
    fewest = [o for o in fewest if o.cut != 4] + big
    predicted[4] = big
    lossless[4] = Offer(4, 0.0, 10**10, 10**10)
    probed: list[int] = []
    choice = choose_by_probing(cuts, lossless, fewest, lambda c: probed.append(c) or predicted[c], s)
    assert 4 not in probed and 4 not in choice.calibrated
    assert choice.pruned["4"].startswith("at least ") and "every tensor and the activation at 2 bits" in \
        choice.pruned["4"]
    every = [o for c in cuts for o in [lossless[c.index], *predicted[c.index]]]
    assert choice.calibrated == choose_cuts(every, cuts, s).calibrated
