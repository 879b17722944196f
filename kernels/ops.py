"""Public kernel entry points: the native fast path when it was built, the numpy reference otherwise.

The backend is chosen once at import: ``QPART_KERNELS=numpy`` forces the reference,
``QPART_KERNELS=native`` makes a missing extension an error, and the default ``auto`` falls back
to numpy with one visible warning.

The native extension is one portable build holding its loops at several x86-64 levels (baseline,
x86-64-v3 with AVX2, x86-64-v4 with AVX-512; ADR 0026) and runs the widest this CPU supports;
``QPART_KERNELS_ISA`` names another (``baseline`` always works), and :func:`native_isa` says which
runs. Every level gives the same bytes (``tests/kernels/test_dispatch.py``). It has no effect on the
numpy reference (``QPART_KERNELS=numpy``, or no extension built).
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from types import ModuleType

import numpy as np
import numpy.typing as npt

from qpart.kernels.errors import KernelError, QuantizationError
from qpart.kernels.packing import (
    U8Array,
    check_bits,
    pack_codes_numpy,
    packed_size,
    unpack_codes_numpy,
)
from qpart.kernels.quantization import (
    F32Array,
    QuantScheme,
    dequantize_numpy,
    quantize_numpy,
)

BACKEND_ENV = "QPART_KERNELS"
ISA_ENV = "QPART_KERNELS_ISA"


class Backend(StrEnum):
    """Which implementation serves the kernel calls."""

    NATIVE = "native"
    """The C extension ``kernels._native`` (GIL released)."""
    NUMPY = "numpy"
    """The pure numpy reference."""


def _load_native() -> ModuleType | None:
    choice = os.environ.get(BACKEND_ENV, "auto").lower()
    if choice not in {"auto", "native", "numpy"}:
        raise KernelError(f"{BACKEND_ENV} must be auto, native or numpy, got '{choice}'")
    if choice == "numpy":
        return None
    try:
        from qpart.kernels import _native  # type: ignore[attr-defined]  # noqa: PLC0415 (optional build)
    except ImportError as exc:
        if choice == "native":
            raise KernelError(f"{BACKEND_ENV}=native but the extension is not built: {exc}") from exc
        warnings.warn(
            f"qpart kernels: native extension not built ({exc}); using the numpy reference",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    isa = os.environ.get(ISA_ENV, "auto").lower()  # ignored with the numpy reference
    if isa != "auto":
        try:
            _native.use_isa(isa)
        except ValueError as exc:
            raise KernelError(f"{ISA_ENV}={isa}: {exc}; this machine runs: "
                              f"{', '.join(_native.isas())} (or auto)") from exc
    return _native  # type: ignore[no-any-return]


_NATIVE = _load_native()


def active_backend() -> Backend:
    """The backend chosen at import."""
    return Backend.NATIVE if _NATIVE is not None else Backend.NUMPY


def native_isa() -> str | None:
    """The instruction-set level the native kernels run at (``x86-64-v4``, ``x86-64-v3`` or
    ``baseline``), or ``None`` on the numpy reference."""
    return str(_NATIVE.isa()) if _NATIVE is not None else None


@contextlib.contextmanager
def native_isa_used(level: str | None) -> Iterator[None]:
    """Run the native kernels at ``level`` inside the block, then at the level they ran at before;
    ``None``, or the numpy reference, changes nothing. Process-wide and not thread-safe: for
    benchmarks and tests that compare levels, never while other threads call the kernels.

    Raises:
        KernelError: this build or this CPU has no such level.
    """
    if level is None or _NATIVE is None:
        yield
        return
    before = _NATIVE.isa()
    try:
        _NATIVE.use_isa(level)
    except ValueError as exc:
        raise KernelError(f"{exc}; this machine runs: {', '.join(_NATIVE.isas())}") from exc
    try:
        yield
    finally:
        _NATIVE.use_isa(before)


def native_module() -> ModuleType | None:
    """The loaded extension module, or ``None`` (for benchmarks and parity tests)."""
    return _NATIVE


@dataclass(frozen=True)
class PackedTensor:
    """A quantized, packed tensor: logical ``shape``, its scheme, per-group params and codes."""

    shape: tuple[int, ...]
    scheme: QuantScheme
    scales: F32Array
    mins: F32Array
    data: U8Array

    @property
    def numel(self) -> int:
        """Number of logical elements."""
        return math.prod(self.shape)  # np.prod's dispatch cost more than the decode it guards

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: packed codes plus float32 scales and mins."""
        return int(self.data.nbytes + self.scales.nbytes + self.mins.nbytes)


def _out_u8(out: U8Array | None, size: int) -> U8Array:
    if out is None:
        return np.empty(size, dtype=np.uint8)
    if out.dtype != np.uint8 or out.size != size or not out.flags.c_contiguous:
        raise QuantizationError(f"out must be a C-contiguous uint8 array of {size} bytes")
    return out.reshape(-1)


def pack_codes(
    codes: U8Array, bits: int, *, out: U8Array | None = None, backend: Backend | None = None
) -> U8Array:
    """Pack uint8 codes densely (layout in :mod:`kernels.packing`), into ``out`` when given."""
    check_bits(bits)
    flat = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1)
    if _use_native(backend):
        out = _out_u8(out, packed_size(flat.size, bits))
        try:
            _NATIVE.pack(flat, int(bits), out)  # type: ignore[union-attr]
        except ValueError as exc:
            raise QuantizationError(str(exc)) from exc
        return out
    result = pack_codes_numpy(flat, bits)
    if out is not None:
        _out_u8(out, result.size)[:] = result
        return out
    return result


def unpack_codes(
    packed: U8Array, bits: int, n: int, *, out: U8Array | None = None, backend: Backend | None = None
) -> U8Array:
    """Unpack ``n`` codes; ``packed`` must hold exactly ``packed_size(n, bits)`` bytes."""
    check_bits(bits)
    flat = np.ascontiguousarray(packed, dtype=np.uint8).reshape(-1)
    if flat.size != packed_size(n, bits):
        raise QuantizationError(f"packed input holds {flat.size} bytes, expected "
                                f"{packed_size(n, bits)} for {n} codes of {bits} bits")
    if _use_native(backend):
        out = _out_u8(out, n)
        _NATIVE.unpack(flat, int(bits), out)  # type: ignore[union-attr]
        return out
    result = unpack_codes_numpy(flat, bits, n)
    if out is not None:
        _out_u8(out, n)[:] = result
        return out
    return result


def quantize_pack(
    x: npt.ArrayLike, scheme: QuantScheme, *, out: U8Array | None = None, backend: Backend | None = None
) -> PackedTensor:
    """Quantize a float tensor group-wise and pack its codes (fused on the native path).

    Args:
        x: float tensor of any shape, read in C order.
        scheme: bits and group size.
        out: optional preallocated uint8 buffer of ``packed_size(x.size, bits)`` for the codes.
    """
    arr = np.ascontiguousarray(x, dtype=np.float32)
    shape = tuple(int(d) for d in arr.shape)
    flat = arr.reshape(-1)
    if flat.size == 0:
        raise QuantizationError("cannot quantize an empty tensor")
    groups = scheme.groups(flat.size)
    out = _out_u8(out, packed_size(flat.size, scheme.bits))
    scales = np.empty(groups, dtype=np.float32)
    mins = np.empty(groups, dtype=np.float32)
    quantize_pack_into(flat, scheme, out, scales, mins, backend=backend)
    return PackedTensor(shape, scheme, scales, mins, out)


def quantize_pack_into(flat: F32Array, scheme: QuantScheme, out: U8Array, scales: F32Array,
                       mins: F32Array, *, backend: Backend | None = None) -> None:
    """:func:`quantize_pack` of a flat, C-contiguous float32 array into caller-owned buffers
    (``packed_size(n, bits)`` bytes of codes, one scale and min per group), with no checks beyond
    the kernel's own: for callers that lay the buffers out themselves (the activation packet)."""
    if _use_native(backend):
        try:
            _NATIVE.quantize_pack(flat, scheme.bits, scheme.group_size, out, scales, mins)  # type: ignore[union-attr]
        except ValueError as exc:
            raise QuantizationError(str(exc)) from exc
        return
    codes, scales[:], mins[:] = quantize_numpy(flat, scheme)
    pack_codes(codes, scheme.bits, out=out, backend=Backend.NUMPY)


def unpack_dequantize(
    packed: PackedTensor, *, out: F32Array | None = None, backend: Backend | None = None
) -> F32Array:
    """Unpack and dequantize to float32 of ``packed.shape`` (into ``out`` when given)."""
    n = packed.numel
    scheme = packed.scheme
    groups = scheme.groups(n)
    if (packed.scales.size != groups or packed.mins.size != groups
            or packed.data.size != packed_size(n, scheme.bits)):
        raise QuantizationError(
            f"inconsistent packed tensor: {packed.scales.size} scales, {packed.mins.size} mins, "
            f"{packed.data.size} bytes for {n} elements at {scheme.bits} bits, group {scheme.group_size}")
    if out is None:
        out = np.empty(packed.shape, dtype=np.float32)
    elif out.dtype != np.float32 or out.size != n or not out.flags.c_contiguous:
        raise QuantizationError("out must be a C-contiguous float32 array of the tensor's size")
    unpack_dequantize_into(np.ascontiguousarray(packed.data), scheme,
                           np.ascontiguousarray(packed.scales, dtype=np.float32),
                           np.ascontiguousarray(packed.mins, dtype=np.float32), out.reshape(-1),
                           backend=backend)
    return out


def unpack_dequantize_into(codes: U8Array, scheme: QuantScheme, scales: F32Array, mins: F32Array,
                           out: F32Array, *, backend: Backend | None = None) -> None:
    """:func:`unpack_dequantize` from caller-checked buffers (sizes agree with ``out.size``; the
    kernel checks them again) into a flat float32 ``out``: for parsers that validated a packet."""
    if _use_native(backend):
        try:
            _NATIVE.unpack_dequantize(codes, scheme.bits, scheme.group_size, scales, mins, out)  # type: ignore[union-attr]
        except ValueError as exc:
            raise QuantizationError(str(exc)) from exc
        return
    values = unpack_codes_numpy(codes, scheme.bits, out.size)
    out[:] = dequantize_numpy(values, scales.astype(np.float32), mins.astype(np.float32), scheme.group_size)


def fake_quantize(x: npt.ArrayLike, scheme: QuantScheme) -> F32Array:
    """``dequantize(quantize(x))`` with the shape of ``x``: what the receiving side computes with."""
    return unpack_dequantize(quantize_pack(x, scheme))


def _use_native(backend: Backend | None) -> bool:
    if backend is None:
        return _NATIVE is not None
    if backend is Backend.NATIVE and _NATIVE is None:
        raise KernelError("the native backend was requested but is not available")
    return backend is Backend.NATIVE
