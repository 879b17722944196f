"""ElasticTrainer-style timing profiler: per-cut head times of a model, measured on this device.

Two warm-up runs, then ``repeats`` timed runs of every head at batch 1; the median per cut goes
into a device profile, which the planner then prefers to its FLOP estimate.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from models.partition import cuts_of, prepare, split
from models.registry import get_model
from models.timing import median_latency
from profiles.devices import DeviceProfile, MeasuredHeads


def measure_heads(model: str, *, warmup: int = 2, repeats: int = 5, threads: int | None = None,
                  progress: Callable[[int, int], None] | None = None) -> list[float]:
    """Median seconds of the head of every legal cut (index = cut), batch 1."""
    if threads is not None:
        torch.set_num_threads(threads)
    spec = get_model(model)
    gm = prepare(spec.build(), spec.input_shape)
    cuts = cuts_of(gm)
    x = torch.rand((1, *spec.input_shape))
    times = []
    for i, cut in enumerate(cuts):
        times.append(median_latency(split(gm, cut)[0], x, warmup=warmup, repeats=repeats))
        if progress:
            progress(i + 1, len(cuts))
    return times


def profile_device(base: DeviceProfile, model: str, version: str, *, name: str | None = None,
                   warmup: int = 2, repeats: int = 5) -> DeviceProfile:
    """``base`` with measured head times of ``model`` added (for the given artifact version)."""
    head_s = measure_heads(model, warmup=warmup, repeats=repeats)
    measured = dict(base.measured)
    measured[model] = MeasuredHeads(version=version, head_s=head_s, warmup=warmup, repeats=repeats)
    return base.model_copy(update={"measured": measured, "name": name or base.name})
