"""The check a device runs on an ONNX head segment's bytes before it creates a session (ADR 0012).
Needs neither onnx nor torch. The segment's format, operator allow-list and caps are
:mod:`kernels.onnx_format`'s, re-exported here, which is where the rest of the code imports them from.

The check, in order: the sha256 against the content id; the byte cap; the ORT-format marker; then
a bounded walk of the protobuf (:mod:`kernels.onnx_walk`, over :mod:`kernels.protobuf`) that
refuses external data, operator domains other than ONNX's own, an opset other than 18, operators
outside :data:`ALLOWED_OPS`, attributes that carry tensors or graphs or that the operator lacks,
local functions, training info, and more records, nodes, initializers or entries of any repeated
field than the caps, each message against an allow-list of its field numbers and wire types; last,
the static shapes of :mod:`kernels.onnx_shapes` (no tensor over the cap, no more elements in all
than the total cap, none it cannot determine) with each node's estimated work
(:mod:`kernels.onnx_cost`: no more in all than the work budget).
"""

from __future__ import annotations

import hashlib

from qpart.kernels.errors import (
    DigestMismatchError,
    OversizeError,
    TruncatedError,
    UnsafeSegmentError,
    WireFormatError,
)
from qpart.kernels.onnx_format import (
    ALLOWED_OPS,
    INPUT_NAME,
    ONNX_IR_VERSION,
    ONNX_OPSET,
    ONNX_SEGMENT_FORMAT,
    ONNX_SEGMENT_FORMAT_VERSION,
    OUTPUT_NAME,
    HeadRuntime,
    OnnxSegmentInfo,
    OnnxSegmentLimits,
)
from qpart.kernels.onnx_walk import walk_model

__all__ = [
    "ALLOWED_OPS",
    "INPUT_NAME",
    "ONNX_IR_VERSION",
    "ONNX_OPSET",
    "ONNX_SEGMENT_FORMAT",
    "ONNX_SEGMENT_FORMAT_VERSION",
    "OUTPUT_NAME",
    "HeadRuntime",
    "OnnxSegmentInfo",
    "OnnxSegmentLimits",
    "check_onnx_segment",
]

_ORT_FORMAT_MARK = b"ORTM"  # ONNX Runtime's file identifier of its flatbuffer format


def check_onnx_segment(data: bytes, segment_id: str, *, size_bytes: int | None = None,
                       limits: OnnxSegmentLimits | None = None) -> OnnxSegmentInfo:
    """Check an ONNX segment's bytes before anything runs them.

    Args:
        data: the segment as downloaded.
        segment_id: the content id it was asked for (its sha256, hex).
        size_bytes: the size the plan announced, to tell a truncated download apart.
        limits: the caps (default :class:`OnnxSegmentLimits`).

    Raises:
        TruncatedError, DigestMismatchError, OversizeError, UnsafeSegmentError, WireFormatError:
            each with a one-line message saying what was refused.
    """
    limits = limits or OnnxSegmentLimits()
    digest = hashlib.sha256(data).hexdigest()
    if digest != segment_id:
        if size_bytes is not None and len(data) < size_bytes:
            raise TruncatedError(f"ONNX segment {segment_id[:12]} is truncated: {len(data)} of "
                                 f"{size_bytes} bytes")
        raise DigestMismatchError(f"ONNX segment {segment_id[:12]} hashes to {digest[:12]}: not the "
                                  "segment that was asked for")
    if len(data) > limits.max_bytes:
        raise OversizeError(f"ONNX segment is {len(data)} bytes, over the cap of {limits.max_bytes}")
    # ONNX Runtime, given bytes whose 4..7 are b"ORTM", loads them as its own flatbuffer format
    # (an ORT-format model) and never parses the protobuf this check reads: a file can be a
    # well-formed segment here and an unrelated model, with any operator, to ONNX Runtime. Such a
    # file is refused (a segment ONNX writes starts with ir_version then producer_name, never so);
    # the device also tells ONNX Runtime the format (client.onnx_runtime.create_session).
    if bytes(data[4:8]) == _ORT_FORMAT_MARK:
        raise UnsafeSegmentError("ONNX segment carries the ORT-format marker (bytes 4..7 'ORTM'): ONNX "
                                 "Runtime would load it as another model than the one checked")
    try:
        return walk_model(memoryview(data), limits)
    except (TruncatedError, OversizeError, UnsafeSegmentError):
        raise
    except WireFormatError as exc:
        raise WireFormatError(f"ONNX segment does not parse: {exc}") from exc
