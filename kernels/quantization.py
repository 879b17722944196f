"""Asymmetric uniform quantization to 1..8 bits with a scale and min per group: numpy reference.

A tensor is read in C order and cut into groups of ``group_size`` consecutive elements (the last
group may be shorter). Weights use one group per output channel (``group_size = numel // shape[0]``),
activations a fixed group (256 by default, after ActNN/DAF). Per group, in float32::

    scale = max((max - min) / (2**b - 1), FLT_MIN)
    code  = trunc(min((x - min) * (1 / scale) + 0.5, 2**b - 1))     # round to nearest
    x'    = code * scale + min

so ``|x - x'| <= scale / 2`` up to float32 rounding of the two operations above.
The native kernels reproduce these operations bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qpart.kernels.errors import QuantizationError
from qpart.kernels.packing import check_bits

F32Array = npt.NDArray[np.float32]
U8Array = npt.NDArray[np.uint8]

DEFAULT_ACTIVATION_GROUP = 256
_FLT_MIN = np.float32(np.finfo(np.float32).tiny)


@dataclass(frozen=True)
class QuantScheme:
    """How one tensor is quantized: ``bits`` per code, one (scale, min) per ``group_size`` elements."""

    bits: int
    group_size: int

    def __post_init__(self) -> None:
        check_bits(self.bits)
        if self.group_size < 1:
            raise QuantizationError(f"group_size must be >= 1, got {self.group_size}")

    def groups(self, numel: int) -> int:
        """Number of groups of a tensor of ``numel`` elements."""
        return (numel + self.group_size - 1) // self.group_size


def weight_group_size(shape: tuple[int, ...]) -> int:
    """Group size that gives one (scale, min) per output channel of a weight of ``shape``."""
    if not shape or shape[0] < 1:
        raise QuantizationError(f"a weight needs a leading output-channel dimension, got {shape}")
    numel = int(np.prod(shape, dtype=np.int64))
    return max(1, numel // shape[0])


def activation_group(numel: int, largest: int) -> int:
    """Largest divisor of a sample's activation size not above ``largest``.

    Groups then never straddle two samples, so a batch quantizes exactly like single samples.
    """
    for g in range(min(largest, numel), 0, -1):
        if numel % g == 0:
            return g
    return 1


def _as_flat_f32(x: npt.ArrayLike) -> F32Array:
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if flat.size == 0:
        raise QuantizationError("cannot quantize an empty tensor")
    return flat


def group_params_numpy(x: npt.ArrayLike, scheme: QuantScheme) -> tuple[F32Array, F32Array]:
    """Per-group ``(scales, mins)`` as float32 arrays of ``scheme.groups(n)`` entries."""
    flat = _as_flat_f32(x)
    if not np.isfinite(flat).all():
        raise QuantizationError("input holds NaN or infinity")
    starts = np.arange(0, flat.size, scheme.group_size)
    mins = np.minimum.reduceat(flat, starts)
    maxs = np.maximum.reduceat(flat, starts)
    with np.errstate(over="ignore"):
        span = maxs - mins
    if not np.isfinite(span).all():
        raise QuantizationError("a group's range overflows float32")
    qmax = np.float32((1 << scheme.bits) - 1)
    scales = np.maximum(span / qmax, _FLT_MIN).astype(np.float32)
    # -0.0 + 0.0 is +0.0: a group whose min is a zero stores +0.0 whatever the sign the min
    # reduction picked, so both backends (and so segment hashes) agree bit for bit.
    return scales, (mins + np.float32(0.0)).astype(np.float32)


def _expand(per_group: F32Array, group_size: int, n: int) -> F32Array:
    # min(): a group larger than the tensor is one group; never allocate by the group size alone.
    return np.repeat(per_group, min(group_size, n))[:n]


def quantize_numpy(x: npt.ArrayLike, scheme: QuantScheme) -> tuple[U8Array, F32Array, F32Array]:
    """Quantize to ``(codes, scales, mins)``; codes are uint8 ``[n]`` in C order."""
    flat = _as_flat_f32(x)
    scales, mins = group_params_numpy(flat, scheme)
    n = flat.size
    inv = np.float32(1.0) / scales
    qmax = np.float32((1 << scheme.bits) - 1)
    t = (flat - _expand(mins, scheme.group_size, n)) * _expand(inv, scheme.group_size, n)
    t += np.float32(0.5)
    t = np.where(t < qmax + np.float32(0.5), t, qmax)
    return t.astype(np.int32).astype(np.uint8), scales, mins


def dequantize_numpy(
    codes: U8Array, scales: F32Array, mins: F32Array, group_size: int
) -> F32Array:
    """Inverse of :func:`quantize_numpy`: float32 ``[n]``."""
    n = codes.size
    sc = _expand(np.asarray(scales, dtype=np.float32), group_size, n)
    mn = _expand(np.asarray(mins, dtype=np.float32), group_size, n)
    out: F32Array = codes.reshape(-1).astype(np.float32) * sc + mn
    return out
