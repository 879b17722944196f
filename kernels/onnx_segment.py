"""The ONNX form of a head segment (ADR 0012): its metadata, its operator allow-list, and the check
a device runs on the bytes before it creates a session. Needs neither onnx nor torch.

A segment is an ONNX model (opset 18) whose graph maps ``input`` (``[N, *input_shape]`` float32)
to ``activation`` (the head's output at the cut, float32); its quantized weights are initializers
holding the packed codes, scales and mins of the safetensors form, rebuilt in the graph
(:mod:`models.onnx_dequant`). ``producer_name`` and ``producer_version`` say the format and its
version; ``metadata_props`` carry ``model``, ``version``, ``cut`` and ``pattern_id``.

The check, in order: the sha256 against the content id; the byte cap; then a bounded walk of the
protobuf (:mod:`kernels.protobuf`) that refuses external data, operator domains other than
ONNX's own, operators outside :data:`ALLOWED_OPS`, attributes that carry tensors or graphs, local
functions, training info, and more nodes or initializers than the caps.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum

from qpart.kernels.errors import (
    DigestMismatchError,
    OversizeError,
    TruncatedError,
    UnsafeSegmentError,
    WireFormatError,
)
from qpart.kernels.protobuf import VARINT, fields, message, text


class HeadRuntime(StrEnum):
    """What runs a device's head, and so which form of its segment the device downloads."""

    TORCH = "torch"
    """PyTorch: the device builds the head from shared model code and loads the safetensors
    segment's tensors into it (ADR 0003)."""
    ONNX = "onnx"
    """ONNX Runtime: the segment is the head's whole graph, checked before it runs (ADR 0012)."""


ONNX_SEGMENT_FORMAT = "qpart-segment-onnx"
ONNX_SEGMENT_FORMAT_VERSION = "1"
ONNX_OPSET = 18
ONNX_IR_VERSION = 8
INPUT_NAME = "input"
OUTPUT_NAME = "activation"

ALLOWED_OPS: dict[str, str] = {
    "Add": "residual sums; adds the mins when dequantizing",
    "AveragePool": "average pooling",
    "BatchNormalization": "a batch norm that was not folded into a convolution",
    "BitShift": "moving each code row's bits to the bottom of its byte (1, 2 and 4 bits)",
    "BitwiseAnd": "masking one code out of its byte (1, 2 and 4 bits)",
    "Cast": "packed bytes or codes to float32",
    "Concat": "joining the full blocks and the last block of a tensor's codes",
    "Conv": "2-D convolutions",
    "Flatten": "flatten from axis 1",
    "Gather": "picking the byte rows that hold each code row",
    "Gemm": "linear layers",
    "GlobalAveragePool": "adaptive average pooling to 1x1",
    "Identity": "dropout and identity modules",
    "Floor": "dropping the bits below a straddling code (3, 5, 6 and 7 bits)",
    "MatMul": "joining the two bytes that hold a straddling code (3, 5, 6 and 7 bits)",
    "MaxPool": "max pooling",
    "Mod": "dropping the bits above a straddling code",
    "Mul": "multiplying codes by their group's scale",
    "Relu": "ReLU",
    "Reshape": "codes to the tensor's shape",
    "Slice": "dropping the padding codes of a tensor",
}
"""Every operator an ONNX segment may use, with what the builder uses it for. Nothing here reads
files, draws random numbers, or runs a subgraph."""

_DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})

# Field numbers of onnx.proto (ONNX 1.17) that the check reads or refuses.
_MODEL_PRODUCER, _MODEL_PRODUCER_VERSION = 2, 3
_MODEL_OPSET, _MODEL_GRAPH, _MODEL_METADATA = 8, 7, 14
_MODEL_REFUSED = {20: "training information", 25: "local functions (a custom operator domain)"}
_GRAPH_NODE, _GRAPH_INIT, _GRAPH_INPUT, _GRAPH_OUTPUT, _GRAPH_SPARSE = 1, 5, 11, 12, 15
_NODE_OP, _NODE_DOMAIN, _NODE_ATTR = 4, 7, 5
_ATTR_CARRIES = {5: "a tensor", 6: "a graph", 10: "tensors", 11: "graphs", 22: "a sparse tensor",
                 23: "sparse tensors"}
_TENSOR_NAME, _TENSOR_EXTERNAL, _TENSOR_LOCATION = 8, 13, 14


@dataclass(frozen=True)
class OnnxSegmentLimits:
    """Caps a device puts on an ONNX segment before it creates a session for it."""

    max_bytes: int = 256 << 20
    max_nodes: int = 4096
    max_initializers: int = 4096


@dataclass(frozen=True)
class OnnxSegmentInfo:
    """What the check read from a segment that passed it."""

    metadata: dict[str, str]
    ops: frozenset[str]
    nodes: int
    initializers: int
    inputs: tuple[str, ...] = field(default=())
    outputs: tuple[str, ...] = field(default=())


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
    try:
        return _walk_model(memoryview(data), limits)
    except (TruncatedError, OversizeError, UnsafeSegmentError):
        raise
    except WireFormatError as exc:
        raise WireFormatError(f"ONNX segment does not parse: {exc}") from exc


def _walk_model(data: memoryview, limits: OnnxSegmentLimits) -> OnnxSegmentInfo:
    graph: memoryview | None = None
    metadata: dict[str, str] = {}
    producer = {_MODEL_PRODUCER: "", _MODEL_PRODUCER_VERSION: ""}
    for number, _, value in fields(data):
        if number in producer:
            producer[number] = text(value, "producer")
        elif number == _MODEL_OPSET:
            domain = _string_field(message(value, "opset_import"), 1)
            if domain not in _DEFAULT_DOMAINS:
                raise UnsafeSegmentError(f"ONNX segment imports the custom operator domain {_shown(domain)}")
        elif number == _MODEL_GRAPH:
            if graph is not None:  # protobuf would merge two: refuse rather than guess
                raise WireFormatError("the model holds more than one graph")
            graph = message(value, "graph")
        elif number == _MODEL_METADATA:
            entry = message(value, "metadata_props")
            metadata[_string_field(entry, 1)] = _string_field(entry, 2)
        elif number in _MODEL_REFUSED:
            raise UnsafeSegmentError(f"ONNX segment carries {_MODEL_REFUSED[number]}")
    if graph is None:
        raise WireFormatError("the model has no graph")
    _check_producer(producer[_MODEL_PRODUCER], producer[_MODEL_PRODUCER_VERSION])
    return _walk_graph(graph, metadata, limits)


def _check_producer(name: str, version: str) -> None:
    if name != ONNX_SEGMENT_FORMAT:
        raise WireFormatError(f"not a qpart ONNX segment (producer {_shown(name)})")
    if version != ONNX_SEGMENT_FORMAT_VERSION:
        raise WireFormatError(f"ONNX segment format version {_shown(version)} is not supported (this build "
                              f"reads {ONNX_SEGMENT_FORMAT_VERSION})")


def _walk_graph(graph: memoryview, metadata: dict[str, str], limits: OnnxSegmentLimits) -> OnnxSegmentInfo:
    ops: set[str] = set()
    nodes = initializers = 0
    inputs: list[str] = []
    outputs: list[str] = []
    for number, _, value in fields(graph):
        if number == _GRAPH_NODE:
            nodes += 1
            if nodes > limits.max_nodes:
                raise OversizeError(f"ONNX segment has more than {limits.max_nodes} nodes (the cap)")
            ops.add(_check_node(message(value, "node")))
        elif number == _GRAPH_INIT:
            initializers += 1
            if initializers > limits.max_initializers:
                raise OversizeError(f"ONNX segment has more than {limits.max_initializers} initializers "
                                    "(the cap)")
            _check_tensor(message(value, "initializer"))
        elif number == _GRAPH_SPARSE:
            raise UnsafeSegmentError("ONNX segment has sparse initializers (not allowed)")
        elif number in (_GRAPH_INPUT, _GRAPH_OUTPUT):
            (inputs if number == _GRAPH_INPUT else outputs).append(_string_field(message(value, "value"), 1))
    return OnnxSegmentInfo(metadata, frozenset(ops), nodes, initializers, tuple(inputs), tuple(outputs))


def _check_node(node: memoryview) -> str:
    op, domain = "", ""
    for number, _, value in fields(node):
        if number == _NODE_OP:
            op = text(value, "op_type")
        elif number == _NODE_DOMAIN:
            domain = text(value, "domain")
        elif number == _NODE_ATTR:
            for attr_number, _, _ in fields(message(value, "attribute")):
                if attr_number in _ATTR_CARRIES:
                    raise UnsafeSegmentError(f"an attribute carries {_ATTR_CARRIES[attr_number]} "
                                             "(subgraphs and attribute tensors are not allowed)")
    if domain not in _DEFAULT_DOMAINS:
        raise UnsafeSegmentError(
            f"ONNX segment uses operator {_shown(op)} of the custom domain {_shown(domain)}")
    if op not in ALLOWED_OPS:
        raise UnsafeSegmentError(f"ONNX segment uses operator {_shown(op)}, which is not in the allow-list")
    return op


def _check_tensor(tensor: memoryview) -> None:
    name, external = "", False
    for number, wire, value in fields(tensor):
        if number == _TENSOR_NAME:
            name = text(value, "initializer name")
        elif number == _TENSOR_EXTERNAL or (number == _TENSOR_LOCATION and wire == VARINT and value == 1):
            external = True
    if external:
        raise UnsafeSegmentError(
            f"ONNX segment initializer {_shown(name)} refers to external data (a file path)")


def _string_field(msg: memoryview, number: int) -> str:
    """The last value of a string field (protobuf's rule for repeated singular fields)."""
    found = ""
    for n, _, value in fields(msg):
        if n == number:
            found = text(value, f"field {number}")
    return found


def _shown(name: str, limit: int = 60) -> str:
    """A name read from the segment, quoted and escaped for a one-line message (never raw bytes
    from the network in a log line), cut to ``limit`` characters."""
    return ascii(name[:limit] + ("…" if len(name) > limit else ""))
