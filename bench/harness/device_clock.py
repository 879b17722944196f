"""The emulated device's clock: this machine's seconds, scaled to a device whose speed holds still.

``bench.e2e`` emulates a device's compute as this machine's measured time x (host FLOP/s / device
FLOP/s), with the host's FLOP/s taken from a profile just before each cell. But this machine is
shared, and its speed wanders within a cell's seconds by more than the few percent that separate
strategies in a near tie; a real device's speed does not follow the server host's. So every round
of a cell also times a fixed reference workload (:class:`ReferenceClock`: a seeded convolutional
net that is neither reference model), and the round's device seconds are scaled by the reference's
time in the profile over its time in that round. The reference is no strategy's work, so the
all-device time is still measured, not defined: only the host's overall speed is taken out.

``python -m bench.harness.device_clock --json PATH`` checks that this helps: for ``--seconds`` it times
both trained models and the reference in rounds (as the grid times heads), then slides a 2 s
profile window and the 12 s cell after it over the rounds and reports how far each model's median
time in the cell moved from its profile, raw and scaled by the reference.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench import write_json
from qpart.client.profiler import head_calls
from qpart.models.data import Split, load_split
from qpart.models.timing import median_seconds

# How the grid times a head and an encode on the device (untimed calls, then timed calls back to
# back; the median of the timed ones), in its rounds and in the profile before them alike: single
# cold calls read slower than the same work inside a round (heads about 13%, a cut-0 encode and
# deflate about 30%), and plans were then priced against a device slower than the one measured.
HEAD_RUNS = {"settle": 5, "burst": 9}
ENCODE_RUNS = {"settle": 2, "burst": 3}
REFERENCE_SEED = 0


def reference_net() -> nn.Module:
    """The reference workload: two small convolutions and a linear layer, seeded weights."""
    gen = torch.Generator().manual_seed(REFERENCE_SEED)
    net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(512, 10))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return net.eval()


class ReferenceClock:
    """Times the reference workload on ``x`` (one image, batch 1) the way the grid times heads."""

    def __init__(self, x: torch.Tensor) -> None:
        self.net = reference_net()
        self.x = x

    def call(self) -> object:
        """One untimed run (for :func:`models.timing.interleaved_medians`; under inference mode)."""
        return self.net(self.x)

    def seconds(self) -> float:
        """``settle`` untimed runs, then the median of ``burst`` timed ones (:data:`HEAD_RUNS`)."""
        with torch.inference_mode():
            return timed_burst(self.call)


def timed_burst(fn: Callable[[], object]) -> float:
    """``fn`` as the grid times a head: :data:`HEAD_RUNS` untimed calls, then the timed calls' median."""
    return median_seconds(fn, warmup=HEAD_RUNS["settle"], repeats=HEAD_RUNS["burst"])


def drift(samples: Sequence[float], reference: Sequence[float], profile: int, cell: int,
          step: int) -> dict[str, dict[str, float]]:
    """|log(cell median / profile median)| over every window (a ``profile`` rounds, then ``cell``
    rounds), raw and with each cell round scaled by reference-in-profile / reference-in-round."""
    if profile < 1 or cell < 1 or step < 1 or len(samples) != len(reference):
        raise ValueError("windows must hold at least one round and the series must be as long")
    t, ref = np.asarray(samples), np.asarray(reference)
    raw, scaled = [], []
    for s in range(0, len(t) - profile - cell + 1, step):
        prof, rounds = slice(s, s + profile), slice(s + profile, s + profile + cell)
        base = float(np.median(t[prof]))
        raw.append(abs(np.log(float(np.median(t[rounds])) / base)))
        norm = t[rounds] * float(np.median(ref[prof])) / ref[rounds]
        scaled.append(abs(np.log(float(np.median(norm)) / base)))
    if not raw:
        raise ValueError("too few rounds for one profile window and one cell")

    def stats(v: list[float]) -> dict[str, float]:
        return {"median": float(np.median(v)), "p90": float(np.quantile(v, 0.9)), "max": float(np.max(v))}

    return {"raw": stats(raw), "scaled": stats(scaled)}


def run(seconds: float, models: Sequence[str]) -> dict[str, Any]:
    """Time the whole trained models and the reference in rounds for ``seconds``; the drifts."""
    torch.set_num_threads(1)
    x = torch.from_numpy(load_split(Split.TEST, limit=1).images[:1])
    clock = ReferenceClock(x)
    fns: dict[str, Callable[[], object]] = {m: head_calls(m, trained=True, x=x)[-1] for m in models}
    fns["reference"] = clock.call
    rows: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    rng = random.Random(0)
    started = time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - started < seconds:
            rng.shuffle(order)
            for k in order:
                rows[k].append(timed_burst(fns[k]))
            time.sleep(0.002)  # the grid's rounds wait on the link between runs
    per_s = len(rows["reference"]) / seconds
    profile, cell = max(1, round(2 * per_s)), max(1, round(12 * per_s))
    return {"seconds": seconds, "rounds": len(rows["reference"]), "profile_rounds": profile,
            "cell_rounds": cell, "median_s": {k: statistics.median(v) for k, v in rows.items()},
            "drift": {m: drift(rows[m], rows["reference"], profile, cell, step=max(1, profile // 4))
                      for m in models}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True, help="where to write the result")
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to time (default 120)")
    parser.add_argument("--model", action="append", help="reference model (default: both)")
    args = parser.parse_args(argv)
    if not 15 <= args.seconds <= 3600:
        parser.error("--seconds must be between 15 and 3600 (one profile and one cell need 14)")
    doc = run(args.seconds, args.model or ["fmnist-cnn", "fmnist-resnet"])
    write_json(args.json, doc)
    for m, d in doc["drift"].items():
        print(f"{m}: cell median vs profile, raw median {d['raw']['median']:.1%} p90 {d['raw']['p90']:.1%}; "
              f"scaled by the reference median {d['scaled']['median']:.1%} p90 {d['scaled']['p90']:.1%}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
