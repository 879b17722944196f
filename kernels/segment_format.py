"""The head segment a device downloads: a safetensors file (ADR 0002) whose ``__metadata__``
carries the format, model, version, cut, pattern id, a JSON list of tensor descriptors and
``content_sha256``; a quantized tensor ``W`` travels as ``W.codes`` (U8), ``W.scales`` and
``W.mins`` (F32), a float tensor as itself (F32 or F16).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import safetensors

from qpart.kernels.errors import OversizeError, TruncatedError, WireFormatError
from qpart.kernels.ops import PackedTensor
from qpart.kernels.packing import packed_size
from qpart.kernels.quantization import QuantScheme
from qpart.kernels.wire import DEFAULT_MAX_ELEMENTS, MAX_NDIM

SEGMENT_FORMAT = "qpart-segment"
SEGMENT_FORMAT_VERSION = "1"
DEFAULT_MAX_SEGMENT_BYTES = 1 << 30


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
        arr = np.require(arrays[name], requirements="C")  # keeps a 0-d tensor 0-d
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
        arr = np.require(floats[name], requirements="C")  # keeps a 0-d tensor 0-d
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
        arr = np.require(arrays[name], requirements="C")  # keeps a 0-d tensor 0-d
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
