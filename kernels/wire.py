"""The activation packet a device uploads (the head segment it downloads: kernels.segment_format).

Activation packet, format 1 (all integers little-endian, no alignment padding)::

    offset  size      field
    0       4         magic  b"QPA" + version byte 0x01
    4       1         bits               1..8
    5       1         ndim               1..8
    6       2         flags              0 (reserved)
    8       4         group_size         >= 1
    12      4*ndim    dims               each >= 1; n = product(dims) <= limit
    ..      4*G       scales, float32    G = ceil(n / group_size); finite, > 0
    ..      4*G       mins, float32      finite
    ..      bits*ceil(n/8)  packed codes (layout: kernels.packing)

The packet's length must equal the sum exactly. ``bits = 32`` marks an unquantized packet:
``group_size`` is 0 and the dims are followed by ``4*n`` bytes of float32 (no scales or mins).
"""

from __future__ import annotations

import functools
import math
import struct
import sys

import numpy as np
import numpy.typing as npt

from qpart.kernels.errors import OversizeError, QuantizationError, TruncatedError, WireFormatError
from qpart.kernels.ops import (
    PackedTensor,
    quantize_pack,
    quantize_pack_into,
    unpack_dequantize_into,
)
from qpart.kernels.packing import packed_size
from qpart.kernels.quantization import QuantScheme

ACTIVATION_MAGIC = b"QPA\x01"
MAX_NDIM = 8
DEFAULT_MAX_ELEMENTS = 1 << 26
_HEAD = struct.Struct("<4sBBHI")
_DIMS = {n: struct.Struct(f"<{n}I") for n in range(1, MAX_NDIM + 1)}


# ---- activation packet ---------------------------------------------------------------------


def encode_activation(packed: PackedTensor) -> bytes:
    """Serialize a packed activation to the packet format above."""
    shape = packed.shape
    if not 1 <= len(shape) <= MAX_NDIM:
        raise WireFormatError(f"an activation needs 1..{MAX_NDIM} dimensions, got {len(shape)}")
    head = _HEAD.pack(ACTIVATION_MAGIC, packed.scheme.bits, len(shape), 0, packed.scheme.group_size)
    dims = struct.pack(f"<{len(shape)}I", *shape)
    return b"".join([
        head, dims,
        packed.scales.astype("<f4").tobytes(), packed.mins.astype("<f4").tobytes(),
        packed.data.tobytes(),
    ])


def encode_quantized_activation(x: npt.ArrayLike, bits: int, group_size: int) -> bytes:
    """Quantize and pack ``x`` straight into an activation packet: the bytes of
    ``encode_activation(quantize_pack(x, QuantScheme(bits, group_size)))``, written into one
    buffer with no intermediate arrays. It runs on the device before every upload, and most of
    the composed version's time was Python around a sub-microsecond kernel (784 floats at
    4 bits, one thread: 6.6 us composed, the kernel alone 0.65 us)."""
    arr = np.ascontiguousarray(x, dtype=np.float32)
    if sys.byteorder != "little":  # the buffers below are views in native byte order
        return encode_activation(quantize_pack(arr, QuantScheme(bits, group_size)))
    scheme = _scheme(bits, group_size)
    ndim, n = arr.ndim, arr.size
    if not 1 <= ndim <= MAX_NDIM:
        raise WireFormatError(f"an activation needs 1..{MAX_NDIM} dimensions, got {ndim}")
    if n == 0:
        raise QuantizationError("cannot quantize an empty tensor")
    groups = scheme.groups(n)
    scales_at = _HEAD.size + 4 * ndim
    mins_at = scales_at + 4 * groups
    codes_at = mins_at + 4 * groups
    codes = packed_size(n, bits)
    buf = bytearray(codes_at + codes)
    _HEAD.pack_into(buf, 0, ACTIVATION_MAGIC, bits, ndim, 0, group_size)
    _DIMS[ndim].pack_into(buf, _HEAD.size, *arr.shape)
    quantize_pack_into(arr.reshape(-1), scheme, np.frombuffer(buf, np.uint8, codes, codes_at),
                       np.frombuffer(buf, np.float32, groups, scales_at),
                       np.frombuffer(buf, np.float32, groups, mins_at))
    return bytes(buf)


@functools.lru_cache(maxsize=256)
def _scheme(bits: int, group_size: int) -> QuantScheme:
    return QuantScheme(bits, group_size)  # validates; cached: a device encodes with few schemes


FLOAT_BITS = 32


def float_packet_bytes(shape: tuple[int, ...]) -> int:
    """Size of an unquantized packet of ``shape`` (the largest form of any activation)."""
    return _HEAD.size + 4 * len(shape) + 4 * math.prod(shape)


def packet_bytes(shape: tuple[int, ...], bits: int, group_size: int) -> int:
    """Size of the packet that :func:`encode_quantized_activation` (``bits`` < 32) or
    :func:`encode_float_activation` (``bits`` = 32) makes of an activation of ``shape``: its
    header, dims, one float32 scale and min per group, then the packed codes."""
    if bits >= FLOAT_BITS:
        return float_packet_bytes(shape)
    n = math.prod(shape)
    groups = (n + group_size - 1) // group_size
    return _HEAD.size + 4 * len(shape) + 8 * groups + packed_size(n, bits)


def encode_float_activation(x: npt.NDArray[np.floating]) -> bytes:
    """Serialize an unquantized float32 activation (``bits = 32``)."""
    arr = np.ascontiguousarray(x, dtype="<f4")
    if not 1 <= arr.ndim <= MAX_NDIM:
        raise WireFormatError(f"an activation needs 1..{MAX_NDIM} dimensions, got {arr.ndim}")
    head = _HEAD.pack(ACTIVATION_MAGIC, FLOAT_BITS, arr.ndim, 0, 0)
    return head + struct.pack(f"<{arr.ndim}I", *arr.shape) + arr.tobytes()


def _read_dims(data: bytes | memoryview, ndim: int, max_elements: int) -> tuple[tuple[int, ...], int, int]:
    """The packet's dims after the fixed header: ``(shape, numel, offset of what follows)``."""
    offset = _HEAD.size + 4 * ndim
    if len(data) < offset:
        raise TruncatedError(f"activation packet ends inside its {ndim} dimensions")
    shape = _DIMS[ndim].unpack_from(data, _HEAD.size)
    numel = math.prod(shape)
    if min(shape) < 1 or numel > max_elements:
        raise OversizeError(f"shape {shape} has {numel} elements; allowed 1..{max_elements}")
    return shape, numel, offset


def decode_activation_array(data: bytes, *, max_elements: int = DEFAULT_MAX_ELEMENTS) -> tuple[
        npt.NDArray[np.float32], int, int]:
    """Decode either packet kind to float32; returns ``(array, bits, group_size)``."""
    if len(data) >= _HEAD.size and data[:4] == ACTIVATION_MAGIC and data[4] == FLOAT_BITS:
        _, _, ndim, flags, group = _HEAD.unpack_from(data, 0)
        if not 1 <= ndim <= MAX_NDIM or flags != 0 or group != 0:
            raise WireFormatError(f"bad float packet header: ndim={ndim}, flags={flags}, group={group}")
        shape, numel, offset = _read_dims(data, ndim, max_elements)
        if len(data) != offset + 4 * numel:
            cls = TruncatedError if len(data) < offset + 4 * numel else WireFormatError
            raise cls(f"float packet is {len(data)} bytes; shape {shape} needs {offset + 4 * numel}")
        arr = np.frombuffer(data, dtype="<f4", count=numel, offset=offset).astype(np.float32)
        if not np.isfinite(arr).all():
            raise WireFormatError("float activation holds NaN or infinity")
        return arr.reshape(shape), FLOAT_BITS, 0
    view = memoryview(data)
    shape, bits, group, params, codes_at = _parse_quantized(view, max_elements)
    # Read-only views of the packet straight into the kernel: nothing is copied but the result
    # (the little-endian parameters are converted only on a big-endian host).
    params = np.ascontiguousarray(params, dtype=np.float32)
    groups = params.size // 2
    out = np.empty(shape, dtype=np.float32)
    unpack_dequantize_into(np.frombuffer(view, dtype=np.uint8, offset=codes_at), _scheme(bits, group),
                           params[:groups], params[groups:], out.reshape(-1))
    return out, bits, group


def decode_activation(data: bytes, *, max_elements: int = DEFAULT_MAX_ELEMENTS) -> PackedTensor:
    """Parse and validate an activation packet; raises :class:`WireFormatError` on any defect."""
    view = memoryview(data)
    shape, bits, group, params, codes_at = _parse_quantized(view, max_elements)
    groups = params.size // 2
    codes = np.frombuffer(view, dtype=np.uint8, count=len(view) - codes_at, offset=codes_at).copy()
    return PackedTensor(shape, _scheme(bits, group), params[:groups].astype(np.float32),
                        params[groups:].astype(np.float32), codes)


def _parse_quantized(view: memoryview, max_elements: int) -> tuple[
        tuple[int, ...], int, int, npt.NDArray[np.float32], int]:
    """Header, sizes and parameters of a quantized packet, every field checked:
    ``(shape, bits, group_size, scales then mins (a read-only view), offset of the codes)``."""
    if len(view) < _HEAD.size:
        raise TruncatedError(f"activation packet is {len(view)} bytes, its header needs {_HEAD.size}")
    magic, bits, ndim, flags, group = _HEAD.unpack_from(view, 0)
    if magic != ACTIVATION_MAGIC:
        raise WireFormatError(f"not an activation packet (magic {bytes(magic)!r}, want {ACTIVATION_MAGIC!r})")
    if not 1 <= bits <= 8:
        raise WireFormatError(f"bits must be 1..8, got {bits}")
    if not 1 <= ndim <= MAX_NDIM or flags != 0 or group < 1:
        raise WireFormatError(f"bad header: ndim={ndim} (1..{MAX_NDIM}), flags={flags} (0), "
                              f"group_size={group} (>= 1)")
    shape, numel, offset = _read_dims(view, ndim, max_elements)
    if group > numel:
        raise WireFormatError(f"group_size {group} exceeds the {numel} elements of the packet")
    groups = (numel + group - 1) // group
    want = offset + 8 * groups + packed_size(numel, bits)
    if len(view) != want:
        cls = TruncatedError if len(view) < want else WireFormatError
        raise cls(f"activation packet is {len(view)} bytes; shape {shape} at {bits} bits with "
                  f"group {group} needs {want}")
    params = np.frombuffer(view, dtype="<f4", count=2 * groups, offset=offset)
    if not (np.isfinite(params).all() and (params[:groups] > 0).all()):
        raise WireFormatError("scales must be finite and positive, mins finite")
    return tuple(shape), bits, group, params, offset + 8 * groups
