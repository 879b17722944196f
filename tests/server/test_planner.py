"""The cost model's transfer term: bodies, one round trip and one header allowance per exchange."""

from __future__ import annotations

import pytest

from profiles.artifacts import load_artifact
from profiles.devices import get_device
from server.planner import HTTP_EXCHANGE_BYTES, PlanInputs, price
from server.schemas import PRESETS, WeightPreset


@pytest.fixture(scope="module")
def artifact(artifacts_dir):
    return load_artifact(artifacts_dir / "fmnist-cnn")


def _inputs(held=frozenset()):
    return PlanInputs(get_device("phone-soc"), PRESETS[WeightPreset.LATENCY_FIRST], 8e6, 0.01, 1, 1.0,
                      frozenset(held))


@pytest.mark.parametrize("held", [False, True])
def test_a_middle_cut_downloads_unless_held_and_always_uploads(artifact, held):
    p = next(p for p in artifact.patterns if p.cut == 3 and p.level == 0.01)
    costs = price(artifact, p, "seg", 5000, _inputs({"seg"} if held else set()), 0.001, answer_bytes=600)
    exchanges = 1 if held else 2
    sent = (0 if held else 5000) + p.activation_bytes + 600 + exchanges * HTTP_EXCHANGE_BYTES
    assert costs.transfer_bytes == sent
    assert costs.time_s.transfer == pytest.approx(sent * 8 / 8e6 + exchanges * 0.01)
    assert costs.time_s.server == 0.001


@pytest.mark.parametrize("held", [False, True])
def test_the_last_cut_only_downloads(artifact, held):
    last = len(artifact.cuts) - 1
    p = next(p for p in artifact.patterns if p.cut == last and p.level == 0)
    costs = price(artifact, p, "seg", 9000, _inputs({"seg"} if held else set()), 0.5, answer_bytes=600)
    assert costs.transfer_bytes == (0 if held else 9000 + HTTP_EXCHANGE_BYTES)
    wire = 9000 + HTTP_EXCHANGE_BYTES
    assert costs.time_s.transfer == pytest.approx(0 if held else wire * 8 / 8e6 + 0.01)
    assert costs.time_s.server == 0 and costs.server_cost == 0
