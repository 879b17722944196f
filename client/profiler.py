"""ElasticTrainer-style timing profiler: per-cut head times of a model, measured on this device.

Two warm-up runs, then ``repeats`` timed runs of every head at batch 1; the median per cut goes
into a device profile, which the planner then prefers to its FLOP estimate. The same for
quantizing and packing each cut's activation (what the device does before uploading it).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from client.runtime import encode_for_plan
from kernels import activation_group
from kernels.coding import CODING_BITS, deflate
from models.partition import cuts_of, prepare, split
from models.registry import get_model
from models.timing import median_latency, median_seconds
from profiles.devices import DeviceProfile, MeasuredHeads


def measure_heads(model: str, *, warmup: int = 2, repeats: int = 5, threads: int | None = None,
                  progress: Callable[[int, int], None] | None = None, trained: bool = False,
                  x: torch.Tensor | None = None) -> list[float]:
    """Median seconds of the head of every legal cut (index = cut), batch 1.

    By default the heads are freshly built (no weights needed) and fed uniform noise. With
    ``trained`` they carry the registered model's weights and ``x`` (a real input, say) is fed.
    Seen once here, with other work running: the ResNet's whole head took 1.43-1.90 ms trained on
    a real image against 1.32-1.63 ms untrained on noise; a device that has the weights should
    time those.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    spec = get_model(model)
    gm = prepare(spec.load() if trained else spec.build(), spec.input_shape)
    cuts = cuts_of(gm)
    x = torch.rand((1, *spec.input_shape)) if x is None else x
    times = []
    for i, cut in enumerate(cuts):
        times.append(median_latency(split(gm, cut)[0], x, warmup=warmup, repeats=repeats))
        if progress:
            progress(i + 1, len(cuts))
    return times


def measure_encodes(model: str, *, warmup: int = 2, repeats: int = 5,
                    largest_group: int = 256) -> list[float]:
    """Median seconds to quantize (8 bits) and pack the activation of every cut but the last.

    The group size is the calibration's default rule (the largest divisor of the activation size
    up to 256); the time hardly depends on bits or groups.
    """
    spec = get_model(model)
    gm = prepare(spec.build(), spec.input_shape)
    cuts = cuts_of(gm)
    rng = np.random.default_rng(0)
    times = []
    for cut in cuts[:-1]:
        act = rng.random((1, *cut.shape), dtype=np.float32)
        plan = {"activation_bits": 8, "group_size": activation_group(cut.numel, largest_group)}
        times.append(median_seconds(partial(encode_for_plan, act, plan), warmup=warmup, repeats=repeats))
    return times


def deflate_times(activations: list[np.ndarray], *, warmup: int = 2, repeats: int = 5,
                  largest_group: int = 256) -> list[dict[int, float]]:
    """Per activation (one per cut), median seconds to deflate its packet at each bits (1..8, 32).

    Measured per packet, not fitted over sizes: zlib's time is far from linear in the size (a line
    fitted through one image's packets of every cut put five times the measured time on a 452 B
    one; commit c63db9a)."""
    out = []
    for act in activations:
        group = activation_group(act[0].size, largest_group)
        times = {}
        for bits in CODING_BITS:
            packet = encode_for_plan(act, {"activation_bits": bits, "group_size": group})
            times[bits] = median_seconds(partial(deflate, packet), warmup=warmup, repeats=repeats)
        out.append(times)
    return out


def measure_deflate(model: str, *, warmup: int = 2, repeats: int = 5,
                    largest_group: int = 256) -> list[dict[int, float]]:
    """:func:`deflate_times` of ``model``'s cuts but the last, on a sparse random activation (half
    zeros, as after a ReLU)."""
    spec = get_model(model)
    cuts = cuts_of(prepare(spec.build(), spec.input_shape))
    rng = np.random.default_rng(0)
    acts = [rng.random((1, *c.shape), dtype=np.float32) * (rng.random((1, *c.shape)) < 0.5).astype(np.float32)
            for c in cuts[:-1]]
    return deflate_times(acts, warmup=warmup, repeats=repeats, largest_group=largest_group)


def profile_device(base: DeviceProfile, model: str, version: str, *, name: str | None = None,
                   warmup: int = 2, repeats: int = 5) -> DeviceProfile:
    """``base`` with measured head, encode and deflate times of ``model`` added (for the given
    artifact version)."""
    head_s = measure_heads(model, warmup=warmup, repeats=repeats)
    encode_s = measure_encodes(model, warmup=warmup, repeats=repeats)
    measured = dict(base.measured)
    measured[model] = MeasuredHeads(version=version, head_s=head_s, encode_s=encode_s, warmup=warmup,
                                    repeats=repeats,
                                    deflate_s=measure_deflate(model, warmup=warmup, repeats=repeats))
    return base.model_copy(update={"measured": measured, "name": name or base.name})
