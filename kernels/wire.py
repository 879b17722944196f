"""Wire formats: the activation packet a device uploads and the head segment a device downloads.

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
Head segment: a safetensors file (ADR 0002)
whose ``__metadata__`` carries the format, model, version, cut, pattern id, a JSON list of tensor
descriptors and ``content_sha256``; a quantized tensor ``W`` travels as ``W.codes`` (U8),
``W.scales`` and ``W.mins`` (F32), a float tensor as itself (F32 or F16).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import safetensors

from kernels.errors import OversizeError, QuantizationError, TruncatedError, WireFormatError
from kernels.ops import (
    PackedTensor,
    quantize_pack,
    quantize_pack_into,
    unpack_dequantize_into,
)
from kernels.packing import packed_size
from kernels.quantization import QuantScheme

ACTIVATION_MAGIC = b"QPA\x01"
SEGMENT_FORMAT = "qpart-segment"
SEGMENT_FORMAT_VERSION = "1"
MAX_NDIM = 8
DEFAULT_MAX_ELEMENTS = 1 << 26
DEFAULT_MAX_SEGMENT_BYTES = 1 << 30
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


# ---- head segment --------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentHeader:
    """What a head segment is: which model, version, cut and pattern it was built for."""

    model: str
    version: str
    cut: int
    pattern_id: str
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Segment:
    """A decoded head segment: its header and named tensors (packed or float)."""

    header: SegmentHeader
    quantized: dict[str, PackedTensor]
    floats: dict[str, npt.NDArray[np.float32]]
    content_sha256: str


def _content_digest(descriptors: list[dict[str, object]], arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256(json.dumps(descriptors, sort_keys=True).encode())
    for name in sorted(arrays):
        h.update(name.encode() + b"\0")
        arr = np.ascontiguousarray(arrays[name])
        h.update(arr.astype(arr.dtype.newbyteorder("<")).tobytes())  # same digest on any host
    return h.hexdigest()


def encode_segment(
    header: SegmentHeader,
    quantized: Mapping[str, PackedTensor],
    floats: Mapping[str, npt.NDArray[np.floating]],
) -> bytes:
    """Serialize a head segment (safetensors container, metadata described in the module doc)."""
    arrays: dict[str, np.ndarray] = {}
    descriptors: list[dict[str, object]] = []
    for name in sorted(quantized):
        pt = quantized[name]
        descriptors.append({"name": name, "kind": "quant", "shape": list(pt.shape),
                            "bits": pt.scheme.bits, "group_size": pt.scheme.group_size})
        arrays[f"{name}.codes"] = pt.data
        arrays[f"{name}.scales"] = pt.scales.astype(np.float32)
        arrays[f"{name}.mins"] = pt.mins.astype(np.float32)
    for name in sorted(floats):
        arr = np.ascontiguousarray(floats[name])
        kind = "fp16" if arr.dtype == np.float16 else "fp32"
        arr = arr.astype(np.float16 if kind == "fp16" else np.float32)
        descriptors.append({"name": name, "kind": kind, "shape": list(arr.shape)})
        arrays[name] = arr
    metadata = {
        "format": SEGMENT_FORMAT, "format_version": SEGMENT_FORMAT_VERSION,
        "model": header.model, "version": header.version, "cut": str(header.cut),
        "pattern_id": header.pattern_id, "tensors": json.dumps(descriptors),
        "content_sha256": _content_digest(descriptors, arrays),
        **{f"x-{k}": v for k, v in header.extra.items()},
    }
    return _serialize(arrays, metadata)


_DTYPE_NAMES = {np.dtype(np.uint8): "U8", np.dtype("<f4"): "F32", np.dtype("<f2"): "F16"}


def _serialize(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> bytes:
    """Byte-stable safetensors serialization (sorted names and keys).

    The library's writer orders its JSON header from a hash map, so two encodings of the same
    content can differ byte for byte; content addressing needs the same bytes every time.
    ``decode_segment`` reads the result back with the library's own (validating) parser.
    """
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    blobs = []
    offset = 0
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _DTYPE_NAMES[arr.dtype.newbyteorder("<")], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":"), sort_keys=False).encode()
    head += b" " * (-len(head) % 8)  # safetensors pads its header to 8-byte alignment
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def _read_metadata(data: bytes, max_bytes: int) -> dict[str, str]:
    if len(data) > max_bytes:
        raise OversizeError(f"segment is {len(data)} bytes, limit {max_bytes}")
    if len(data) < 8:
        raise TruncatedError("segment shorter than its 8-byte header length")
    (hlen,) = struct.unpack_from("<Q", data, 0)
    if hlen > min(len(data) - 8, 16 << 20):
        raise TruncatedError(f"segment header claims {hlen} bytes; the file has {len(data) - 8}")
    try:
        header = json.loads(bytes(data[8 : 8 + hlen]))
        meta = header["__metadata__"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise WireFormatError(f"segment header is not valid safetensors JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != SEGMENT_FORMAT:
        raise WireFormatError("not a qpart head segment (metadata 'format' missing)")
    if meta.get("format_version") != SEGMENT_FORMAT_VERSION:
        raise WireFormatError(f"segment format version {meta.get('format_version')!r} is not "
                              f"supported (this build reads {SEGMENT_FORMAT_VERSION})")
    return {str(k): str(v) for k, v in meta.items()}


def decode_segment(data: bytes, *, max_bytes: int = DEFAULT_MAX_SEGMENT_BYTES) -> Segment:
    """Parse and verify a head segment; raises :class:`WireFormatError` on any defect."""
    meta = _read_metadata(data, max_bytes)
    try:
        raw = {name: info for name, info in safetensors.deserialize(data)}  # type: ignore[no-untyped-call]
        descriptors = json.loads(meta["tensors"])
        header = SegmentHeader(meta["model"], meta["version"], int(meta["cut"]), meta["pattern_id"],
                               {k[2:]: v for k, v in meta.items() if k.startswith("x-")})
    except (safetensors.SafetensorError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise WireFormatError(f"malformed segment: {exc}") from exc
    arrays = {name: _to_array(name, info) for name, info in raw.items()}
    quantized, floats = _tensors_from(descriptors, arrays)
    digest = _content_digest(descriptors, arrays)
    if digest != meta.get("content_sha256"):
        raise WireFormatError("segment content does not match its content_sha256")
    return Segment(header, quantized, floats, digest)


_DTYPES = {"U8": np.uint8, "F32": np.dtype("<f4"), "F16": np.dtype("<f2")}


def _to_array(name: str, info: Mapping[str, object]) -> np.ndarray:
    dtype = _DTYPES.get(str(info["dtype"]))
    if dtype is None:
        raise WireFormatError(f"tensor '{name}' has unsupported dtype {info['dtype']}")
    shape = tuple(int(d) for d in info["shape"])  # type: ignore[attr-defined]
    return np.frombuffer(info["data"], dtype=dtype).reshape(shape)  # type: ignore[call-overload,no-any-return]


def _tensors_from(
    descriptors: object, arrays: Mapping[str, np.ndarray]
) -> tuple[dict[str, PackedTensor], dict[str, npt.NDArray[np.float32]]]:
    if not isinstance(descriptors, list):
        raise WireFormatError("segment 'tensors' metadata must be a list")
    quantized: dict[str, PackedTensor] = {}
    floats: dict[str, npt.NDArray[np.float32]] = {}
    used: set[str] = set()
    for d in descriptors:
        try:
            name, kind = str(d["name"]), str(d["kind"])
            shape = _descriptor_shape(name, d["shape"])
            if kind == "quant":
                quantized[name] = _quant_tensor(name, shape, int(d["bits"]), int(d["group_size"]), arrays)
                used |= {f"{name}.codes", f"{name}.scales", f"{name}.mins"}
            elif kind in ("fp32", "fp16"):
                arr = arrays[name]
                if arr.shape != shape:
                    raise WireFormatError(f"tensor '{name}' is {arr.shape}, descriptor says {shape}")
                floats[name] = arr.astype(np.float32)
                used.add(name)
            else:
                raise WireFormatError(f"tensor '{name}' has unknown kind '{kind}'")
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            if isinstance(exc, WireFormatError):
                raise
            raise WireFormatError(f"bad tensor descriptor {d!r}: {exc}") from exc
    if used != set(arrays):
        raise WireFormatError(f"tensors without descriptors: {sorted(set(arrays) - used)}")
    return quantized, floats


def _descriptor_shape(name: str, raw: object) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in raw):
        raise WireFormatError(f"tensor '{name}' shape must be a list of integers")
    shape = tuple(raw)
    if any(v < 0 for v in shape) or len(shape) > MAX_NDIM or math.prod(shape) > DEFAULT_MAX_ELEMENTS:
        raise WireFormatError(f"tensor '{name}' has an invalid or oversized shape {shape}")
    return shape


def _quant_tensor(
    name: str, shape: tuple[int, ...], bits: int, group: int, arrays: Mapping[str, np.ndarray]
) -> PackedTensor:
    numel = math.prod(shape)
    if numel < 1:
        raise WireFormatError(f"tensor '{name}' is quantized but has no elements")
    if not 1 <= group <= numel:
        raise WireFormatError(f"tensor '{name}': group_size {group} outside 1..{numel}")
    scheme = QuantScheme(bits, group)
    codes, scales, mins = arrays[f"{name}.codes"], arrays[f"{name}.scales"], arrays[f"{name}.mins"]
    groups = scheme.groups(numel)
    if codes.size != packed_size(numel, bits) or scales.size != groups or mins.size != groups:
        raise WireFormatError(f"tensor '{name}': sizes of codes/scales/mins do not fit shape "
                              f"{shape} at {bits} bits, group {group}")
    if not (np.isfinite(scales).all() and np.isfinite(mins).all() and (scales > 0).all()):
        raise WireFormatError(f"tensor '{name}': scales must be finite and positive, mins finite")
    return PackedTensor(shape, scheme, scales.astype(np.float32).reshape(-1),
                        mins.astype(np.float32).reshape(-1), codes.reshape(-1).copy())
