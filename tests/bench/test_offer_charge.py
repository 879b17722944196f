"""bench.e2e.analyses.offer_charge: the planner's J per repetition plus its offer's encoding, less what it
uploaded."""

from __future__ import annotations

import pytest

from bench.e2e.analyses.offer_charge import charged_cell, near, offer_seconds, product_share
from qpart.client.image_offers import FAR, REFRESH, REFRESH_FAR
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


def _priced(rep: dict, qpart_j: float, png_j: float, webp_j: float) -> dict:
    for k, j in (("qpart", qpart_j), ("input-png", png_j), ("input-webp@60", webp_j)):
        rep["strategies"][k]["predicted_J"] = j
    return rep


def test_a_repetition_is_far_only_where_every_offered_image_plan_prices_far_above():
    near_rep = _priced(_rep("c0-x", 1, 1), 1.0, 2.0, 1.0 + FAR - 1e-9)  # the WebP just short of far
    far_rep = _priced(_rep("c0-x", 1, 1), 1.0, 2.0, 1.0 + FAR)
    assert near(near_rep, "fmnist-cnn", png_only=False)
    assert not near(far_rep, "fmnist-cnn", png_only=False)
    assert not near(near_rep, "fmnist-cnn", png_only=True)  # the PNG alone: far
    chosen = _priced(_rep("input-png", 1, 1), 1.0, 1.0, 1.5)  # an image plan chosen: near
    assert near(chosen, "fmnist-cnn", png_only=False)
    cell = {"model": "fmnist-cnn", "repetitions": [far_rep, far_rep]}
    assert product_share(cell, png_only=False) == 1 / REFRESH_FAR
    assert product_share({**cell, "repetitions": [far_rep, near_rep]}, png_only=False) == 1 / REFRESH


@pytest.mark.parametrize(("png_j", "share"), [(2.0, 1 / REFRESH_FAR), (1.1, 1 / REFRESH)])
def test_a_cell_is_charged_the_product_devices_share(png_j, share):
    reps = [_priced(_rep("c0-x", 0.010, 0.0100001), 1.0, png_j, 2.0) for _ in range(3)]
    cell = {"model": "fmnist-cnn", "device": "raspberry-pi-4", "rate_mbps": 1.0, "preset": "latency-first",
            "cache": "cold", "repetitions": reps}
    w, device = PRESETS[WeightPreset.LATENCY_FIRST], get_device("raspberry-pi-4")
    extra = share * 4e-3
    j = 0.010 + w.time * extra + w.energy * device.compute_energy_j(extra, 0.0)
    got = charged_cell(cell, png_only=False, scale=None)
    assert got["best"] == "all-server" and got["regret"] == pytest.approx(j / 0.0100001 - 1.0)


def test_a_near_repetition_brings_the_frequent_refresh_to_the_whole_cell():
    reps = [_priced(_rep("c0-x", 0.010, 0.0100001), 1.0, png_j, 2.0) for png_j in (2.0, 2.0, 1.1)]
    cell = {"model": "fmnist-cnn", "device": "raspberry-pi-4", "rate_mbps": 1.0, "preset": "latency-first",
            "cache": "cold", "repetitions": reps}
    w, device = PRESETS[WeightPreset.LATENCY_FIRST], get_device("raspberry-pi-4")
    extra = 4e-3 / REFRESH
    j = 0.010 + w.time * extra + w.energy * device.compute_energy_j(extra, 0.0)
    assert charged_cell(cell, png_only=False, scale=None)["regret"] == pytest.approx(j / 0.0100001 - 1.0)
