"""bench.offer_charge: the planner's J per repetition plus its offer's encoding, less what it uploaded."""

from __future__ import annotations

import pytest

from bench.offer_charge import charged_cell, offer_seconds
from qpart.profiles.devices import get_device
from qpart.server.schemas import PRESETS, WeightPreset


def _rep(qpart_pattern: str, qpart_j: float, other_j: float) -> dict:
    def s(j: float, local: float = 0.0, pid: str = "x") -> dict:
        return {"measured_J": j, "predicted_local_s": local, "meets_demand": True, "pattern_id": pid}

    return {"strategies": {"qpart": s(qpart_j, pid=qpart_pattern), "all-server": s(other_j),
                           "input-png": s(0.5, local=1e-3), "input-webp@60": s(0.6, local=3e-3)}}


def test_the_offer_is_what_was_encoded_beyond_the_uploaded_image():
    assert offer_seconds(_rep("c0-x", 1, 1), "fmnist-cnn", png_only=False) == pytest.approx(4e-3)
    assert offer_seconds(_rep("c0-x", 1, 1), "fmnist-cnn", png_only=True) == pytest.approx(1e-3)
    assert offer_seconds(_rep("input-webp@60", 1, 1), "fmnist-cnn", png_only=False) == pytest.approx(1e-3)
    assert offer_seconds(_rep("input-png", 1, 1), "fmnist-cnn", png_only=False) == pytest.approx(3e-3)


def test_a_cell_is_charged_in_every_repetition_and_judged_again():
    cell = {"model": "fmnist-cnn", "device": "raspberry-pi-4", "rate_mbps": 1.0, "preset": "energy-first",
            "cache": "cold", "repetitions": [_rep("c0-x", 0.010, 0.0105) for _ in range(3)]}
    w, device = PRESETS[WeightPreset.ENERGY_FIRST], get_device("raspberry-pi-4")
    extra = w.time * 4e-3 + w.energy * device.compute_energy_j(4e-3, 0.0)
    got = charged_cell(cell, png_only=False, scale=1.0)
    assert got["regret"] == pytest.approx((0.010 + extra) / 0.0105 - 1.0)
    assert got["best"] == "all-server" and got["significant_loss"] == ((0.010 + extra) / 0.0105 > 1.05)
    none = charged_cell(cell, png_only=False, scale=0.0)
    assert none["best"] == "qpart" and none["regret"] == 0.0 and not none["significant_loss"]
