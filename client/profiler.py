"""ElasticTrainer-style timing profiler: per-cut head times of a model, measured on this device.

Two warm-up runs, then at least ``repeats`` timed rounds at batch 1, each running every cut's head
in turn (see :func:`models.timing.interleaved_medians`: a machine whose speed wanders slows all
cuts alike, so their ratios hold; ``settle`` and ``burst`` time a head as a run of calls, where
that is how it will run); the median per cut goes into a device profile, which the planner then
prefers to its FLOP estimate. With ``min_seconds`` the rounds go on until that long has passed. The
same for quantizing and packing each cut's activation and for compressing its packet in each
upload coding, deflate and zstd (what the device does before uploading it).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from qpart.client.plans import PacketFormat
from qpart.client.runtime import encode_for_plan
from qpart.kernels import activation_group
from qpart.kernels.coding import CODING_BITS, Coding, encode
from qpart.models.partition import cuts_of, prepare, split
from qpart.models.registry import get_model
from qpart.models.timing import interleaved_medians
from qpart.profiles.devices import DeviceProfile, MeasuredHeads


def measure_heads(model: str, *, warmup: int = 2, repeats: int = 5, min_seconds: float = 0.0,
                  settle: int = 0, burst: int = 1, threads: int | None = None, trained: bool = False,
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
    with torch.inference_mode():
        return interleaved_medians(head_calls(model, trained=trained, x=x), warmup=warmup, repeats=repeats,
                                   min_seconds=min_seconds, settle=settle, burst=burst)


def head_calls(model: str, *, trained: bool = False,
               x: torch.Tensor | None = None) -> list[Callable[[], object]]:
    """One call per legal cut (index = cut) that runs that cut's head on ``x`` (see
    :func:`measure_heads`); call them under ``torch.inference_mode``. For timing the heads in the
    same rounds as other work."""
    spec = get_model(model)
    gm = prepare(spec.load() if trained else spec.build(), spec.input_shape)
    x = torch.rand((1, *spec.input_shape)) if x is None else x
    return [partial(split(gm, cut)[0], x) for cut in cuts_of(gm)]


def measure_encodes(model: str, *, warmup: int = 2, repeats: int = 5, min_seconds: float = 0.0,
                    settle: int = 0, burst: int = 1, largest_group: int = 256) -> list[float]:
    """Median seconds to quantize (8 bits) and pack the activation of every cut but the last.

    The group size is the calibration's default rule (the largest divisor of the activation size
    up to 256); the time hardly depends on bits or groups.
    """
    spec = get_model(model)
    gm = prepare(spec.build(), spec.input_shape)
    rng = np.random.default_rng(0)
    encodes = []
    for cut in cuts_of(gm)[:-1]:
        act = rng.random((1, *cut.shape), dtype=np.float32)
        plan = PacketFormat(activation_bits=8, group_size=activation_group(cut.numel, largest_group))
        encodes.append(partial(encode_for_plan, act, plan))
    return interleaved_medians(encodes, warmup=warmup, repeats=repeats, min_seconds=min_seconds,
                               settle=settle, burst=burst)


CodingSeconds = dict[Coding, list[dict[int, float]]]  # per coding, per cut, per bits


def coding_times(activations: list[np.ndarray], *, warmup: int = 2, repeats: int = 5,
                 min_seconds: float = 0.0, settle: int = 0, burst: int = 1,
                 largest_group: int = 256) -> CodingSeconds:
    """Per coding, per activation (one per cut), median seconds to compress its packet at each
    bits (1..8, 32); every coding timed in the same rounds.

    Measured per packet, not fitted over sizes: zlib's time is far from linear in the size (a line
    fitted through one image's packets of every cut put five times the measured time on a 452 B
    one; commit c63db9a)."""
    keys, calls = [], []
    for i, act in enumerate(activations):
        group = activation_group(act[0].size, largest_group)
        for bits in CODING_BITS:
            packet = encode_for_plan(act, PacketFormat(activation_bits=bits, group_size=group))
            for coding in Coding:
                keys.append((coding, i, bits))
                calls.append(partial(encode, packet, coding))
    times = interleaved_medians(calls, warmup=warmup, repeats=repeats, min_seconds=min_seconds,
                                settle=settle, burst=burst)
    out: CodingSeconds = {coding: [{} for _ in activations] for coding in Coding}
    for (coding, i, bits), t in zip(keys, times, strict=True):
        out[coding][i][bits] = t
    return out


def measure_codings(model: str, *, warmup: int = 2, repeats: int = 5, min_seconds: float = 0.0,
                    largest_group: int = 256) -> CodingSeconds:
    """:func:`coding_times` of ``model``'s cuts but the last, on a sparse random activation (half
    zeros, as after a ReLU)."""
    spec = get_model(model)
    cuts = cuts_of(prepare(spec.build(), spec.input_shape))
    rng = np.random.default_rng(0)
    acts = [rng.random((1, *c.shape), dtype=np.float32) * (rng.random((1, *c.shape)) < 0.5).astype(np.float32)
            for c in cuts[:-1]]
    return coding_times(acts, warmup=warmup, repeats=repeats, min_seconds=min_seconds,
                        largest_group=largest_group)


def profile_device(base: DeviceProfile, model: str, version: str, *, name: str | None = None,
                   warmup: int = 2, repeats: int = 5, min_seconds: float = 0.0) -> DeviceProfile:
    """``base`` with measured head, encode and coding times of ``model`` added (for the given
    artifact version); each kind timed for at least ``repeats`` rounds and ``min_seconds``."""
    head_s = measure_heads(model, warmup=warmup, repeats=repeats, min_seconds=min_seconds)
    encode_s = measure_encodes(model, warmup=warmup, repeats=repeats, min_seconds=min_seconds)
    coded = measure_codings(model, warmup=warmup, repeats=repeats, min_seconds=min_seconds)
    measured = dict(base.measured)
    measured[model] = MeasuredHeads(version=version, head_s=head_s, encode_s=encode_s,
                                    coding_s=coded,
                                    warmup=warmup, repeats=repeats, min_seconds=min_seconds)
    return base.model_copy(update={"measured": measured, "name": name or base.name})
