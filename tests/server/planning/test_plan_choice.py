"""planning.choice.plan_request: one call that prices every admissible pattern and picks one,
reading nothing but its arguments."""

from __future__ import annotations

import pytest

from qpart.profiles.artifacts import load_artifact
from qpart.profiles.costs import PlanInputs
from qpart.profiles.devices import get_device
from qpart.server.errors import UnprocessableError
from qpart.server.planning.choice import ServerPrices, plan_request
from qpart.server.schemas import PRESETS, WeightPreset


@pytest.fixture(scope="module")
def artifact(artifacts_dir):
    return load_artifact(artifacts_dir / "fmnist-cnn")


def _inputs(rate_bps=1e6):
    return PlanInputs(get_device("phone-soc"), PRESETS[WeightPreset.LATENCY_FIRST], rate_bps, 0.01, 1, 1.0,
                      frozenset())


def _prices(artifact):
    cuts = len(artifact.cuts)
    return ServerPrices([0.001] * cuts, {"identity": [0.0] * cuts}, 600)


def _every_pattern(pattern):
    return (None, 0) if pattern.cut == 0 else (f"seg-{pattern.pattern_id}", 5000)


def test_plan_request_offers_only_what_the_offer_function_offers(artifact):
    asked = []

    def cut_zero_only(pattern):
        asked.append(pattern)
        return (None, 0) if pattern.cut == 0 else None

    outcome = plan_request(artifact, 0.01, None, _inputs(), _prices(artifact), cut_zero_only, [])
    assert outcome.chosen.pattern.cut == 0
    assert outcome.all_server.pattern.cut == 0
    assert outcome.all_device is None  # the last cut was never offered
    assert outcome.image is None
    assert {p.pattern_id for p in asked} == {p.pattern_id for p in artifact.patterns if p.level <= 0.01}


def test_plan_request_prices_every_cut_and_keeps_the_ends(artifact):
    outcome = plan_request(artifact, 0.01, None, _inputs(), _prices(artifact), _every_pattern, [])
    assert outcome.all_device is not None
    assert outcome.all_device.pattern.cut == len(artifact.cuts) - 1
    assert outcome.chosen.costs.objective <= min(outcome.all_server.costs.objective,
                                                 outcome.all_device.costs.objective)
    assert outcome.chosen.pattern.level <= 0.01


def test_plan_request_refuses_a_deadline_no_plan_meets(artifact):
    with pytest.raises(UnprocessableError, match="no plan meets the deadline"):
        plan_request(artifact, 0.01, 1e-9, _inputs(), _prices(artifact), _every_pattern, [])
