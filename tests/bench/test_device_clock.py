"""The emulated device's clock (bench.harness.device_clock) and the grid's rounds that use it."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from bench.e2e import run_rounds
from bench.harness.device_clock import ReferenceClock, drift, reference_net


def test_the_reference_workload_is_the_same_net_every_time():
    a, b = reference_net(), reference_net()
    x = torch.rand(1, 1, 28, 28)
    with torch.inference_mode():
        assert torch.equal(a(x), b(x))


def test_the_reference_times_a_burst():
    assert 0.0 < ReferenceClock(torch.rand(1, 1, 28, 28)).seconds() < 1.0


class SlowingClock(ReferenceClock):
    """A reference that takes 1 ms, then 2 ms from the third round on: the host halved its speed."""

    def __init__(self) -> None:
        super().__init__(torch.rand(1, 1, 28, 28))
        self.calls = 0

    def seconds(self) -> float:
        self.calls += 1
        return 1e-3 if self.calls <= 2 else 2e-3


def test_rounds_scale_device_seconds_by_the_hosts_speed_in_that_round():
    seen: list[tuple[str, int]] = []

    def once(pid: str, i: int) -> dict[str, float]:
        seen.append((pid, i))
        return {"local": 4e-3, "round_trip": 1e-3, "server": 5e-4}

    runs, speeds = run_rounds(once, ["a", "b"], 3, SlowingClock(), 1e-3, random.Random(0), (4, 4, 0.0))
    assert speeds == [1.0, 1.0, 0.5, 0.5]
    # local seconds follow the reference; what crossed the link and the server's are as measured
    assert [r["local"] for r in runs["a"]] == [4e-3, 4e-3, 2e-3, 2e-3]
    assert all(r["round_trip"] == 1e-3 and r["server"] == 5e-4 for r in runs["b"])
    # every pattern once per round, on the round's image; each image once before any again
    rounds = [{i for _, i in seen[k : k + 2]} for k in range(0, len(seen), 2)]
    assert all(len(r) == 1 for r in rounds)
    assert all({p, q} == {"a", "b"} for (p, _), (q, _) in zip(seen[::2], seen[1::2], strict=True))
    images = [r.pop() for r in rounds]
    assert sorted(images[:3]) == [0, 1, 2] and images[3] == images[0]


def test_rounds_draw_their_images_from_all_of_them_not_the_first_few():
    def images_seen(seed: int) -> list[int]:
        seen: list[int] = []

        def once(pid: str, i: int) -> dict[str, float]:
            seen.append(i)
            return {"local": 0.0}

        run_rounds(once, ["a"], 100, SlowingClock(), 1e-3, random.Random(seed), (5, 5, 0.0))
        return seen

    draws = [images_seen(seed) for seed in range(4)]
    assert all(len(set(d)) == 5 for d in draws)  # no image twice while some are left
    assert len({tuple(d) for d in draws}) == 4  # each repetition (its own rng) its own images
    assert max(max(d) for d in draws) >= 50  # from the whole pool, not its head


def test_rounds_stop_at_the_most_even_with_seconds_left():
    runs, speeds = run_rounds(lambda pid, i: {"local": 0.0}, ["a"], 1, SlowingClock(), 1e-3, random.Random(0),
                              (1, 3, 3600.0))
    assert len(speeds) == len(runs["a"]) == 3


def test_drift_is_zero_for_a_steady_host_and_the_reference_takes_out_a_slowdown():
    steady = [1.0] * 40
    assert drift(steady, steady, 10, 20, 5)["raw"]["max"] == 0.0
    # the host slows by a quarter half way: raw drift sees it, scaled by the reference it is gone
    slowed = [1.0] * 20 + [1.25] * 20
    d = drift(slowed, slowed, 10, 20, 5)
    assert d["raw"]["max"] == pytest.approx(np.log(1.25))
    assert d["scaled"]["max"] == pytest.approx(0.0)
    # a model that slows while the reference does not: the scaled drift keeps it
    assert drift(slowed, steady, 10, 20, 5)["scaled"]["max"] == pytest.approx(np.log(1.25))


def test_drift_refuses_windows_it_cannot_fill():
    with pytest.raises(ValueError, match="too few rounds"):
        drift([1.0] * 10, [1.0] * 10, 5, 10, 1)
    with pytest.raises(ValueError, match="at least one round"):
        drift([1.0] * 10, [1.0] * 9, 5, 1, 1)
