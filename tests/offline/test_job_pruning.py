"""A job with ``--cuts auto`` (the default) validates only the cuts its envelope keeps, each exactly
as ``--cuts all`` validates it; it records the choice in the artifact and the report; and it runs
no pattern twice on one sample set (ADR 0025)."""

from __future__ import annotations

import collections

import pytest

from qpart.models.registry import get_model
from qpart.offline.job import calibrate
from qpart.offline.pruning import envelope
from qpart.offline.runner import ModelRunner
from qpart.offline.state import key
from qpart.server.planning.choice import ServerPrices, plan_request
from tests.offline.resume_driver import settings

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The small job with its cuts chosen (counting every pattern run by cut, bits and sample set),
    and the same job at every cut."""
    seen: collections.Counter[tuple[str, int, int]] = collections.Counter()
    real = ModelRunner.run_pattern

    def counted(self, images, cut, weight_bits, act_bits, tick=None):
        seen[(key(cut, {**weight_bits, "@activation": act_bits}), len(images), images.ctypes.data)] += 1
        return real(self, images, cut, weight_bits, act_bits, tick)

    mp = pytest.MonkeyPatch()
    mp.setattr(ModelRunner, "run_pattern", counted)
    try:
        auto_dir = tmp_path_factory.mktemp("auto")
        # probes on 100 of the 200 fit samples: a set of their own (on all of them, the probes read the
        # mapping's counts but make their own, so that no count of the job's threads stands in for a
        # validation worker's)
        probing = settings(1).model_copy(update={"envelope_probe_samples": 100})
        auto = calibrate(get_model("fmnist-cnn"), probing, auto_dir)
    finally:
        mp.undo()
    every = calibrate(get_model("fmnist-cnn"), settings(1).model_copy(update={"cuts": "all"}),
                      tmp_path_factory.mktemp("all"))
    return auto, every, auto_dir, seen


def test_only_the_chosen_cuts_are_validated_each_as_every_cut_would_be(runs):
    auto, every, _, _ = runs
    choice = auto.cut_choice
    assert choice is not None and choice.mode == "envelope"
    assert auto.calibrated_cuts == choice.calibrated and 0 in choice.calibrated
    assert len(choice.calibrated) < len(auto.cuts)  # the envelope left some out
    assert sorted([*choice.calibrated, *map(int, choice.pruned)]) == list(range(len(auto.cuts)))
    # the calibrated cuts' patterns are every-cut calibration's, bit for bit
    assert auto.patterns == [p for p in every.patterns if p.cut in choice.calibrated]
    assert every.cut_choice is not None and every.cut_choice.mode == "all"
    assert every.calibrated_cuts == list(range(len(every.cuts))) and not every.cut_choice.pruned
    # every legal cut still described (the server indexes them), measured alike (not timed alike)
    untimed = {"server_head_s", "server_tail_s"}
    assert [c.model_dump(exclude=untimed) for c in auto.cuts] == [
        c.model_dump(exclude=untimed) for c in every.cuts]


def test_the_report_names_each_pruned_cut_with_its_reason(runs):
    auto, _, out, _ = runs
    report = (out / "report.md").read_text()
    assert "## Cuts" in report
    shown = ", ".join(map(str, auto.calibrated_cuts))
    assert f"Calibrated: cuts {shown} of {len(auto.cuts)} legal cuts" in report
    for cut, why in auto.cut_choice.pruned.items():
        assert f"| {cut} | {why} |" in report
    assert "the best plan's objective (" in next(iter(auto.cut_choice.pruned.values()))


def test_no_pattern_runs_twice_on_one_sample_set(runs):
    *_, seen = runs
    assert seen, "the job ran no pattern"
    twice = {k: n for k, n in seen.items() if n > 1}
    assert twice == {}


def _worst(pruned, every, s):
    """The largest ratio, over the envelope's requests and the demands, of the objective of the
    server planner's plan on ``pruned`` to its plan on ``every``, and where it was."""
    worst, where = 0.0, ""
    for request in envelope(s):
        def offer(pattern, held=request.held):
            size = 0 if held else pattern.weight_bytes
            return (None, 0) if pattern.cut == 0 else (pattern.pattern_id, size)

        for demand in s.levels:
            best = {}
            for name, artifact in (("every", every), ("pruned", pruned)):
                prices = ServerPrices([c.tail_flops / request.server_flops for c in artifact.cuts], {}, 0)
                best[name] = plan_request(artifact, demand, None, request.inputs, prices, offer, []).chosen
            ratio = best["pruned"].costs.objective / best["every"].costs.objective
            if ratio > worst:
                worst, where = ratio, f"{request.label}, demand {demand} (cut {best['every'].pattern.cut})"
    return worst, where


def test_every_plan_over_the_envelope_is_kept_within_the_margin(runs):
    """The server's own planner, over the envelope the choice priced, on the artifact of every cut
    (today's) and on the pruned one: at every request and demand, the pruned artifact's plan costs
    at most the margin more than the plan of every cut. The choice priced predicted patterns; this
    prices the validated ones, so the two could disagree."""
    auto, every, _, _ = runs
    s = settings(1)
    worst, where = _worst(auto, every, s)
    assert worst <= 1 + s.envelope_margin, f"the pruned artifact's plan costs {worst:.4f}x at {where}"
    # the check can fail: without the last calibrated cut's patterns some plan is lost
    last = max(auto.calibrated_cuts)
    lacking = auto.model_copy(update={"patterns": [p for p in auto.patterns if p.cut != last]})
    assert _worst(lacking, every, s)[0] > 1 + s.envelope_margin
