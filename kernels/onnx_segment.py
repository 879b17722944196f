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
functions, training info, and more nodes or initializers than the caps. The walk reads every
message of the model down to the tensor shapes, each against an allow-list of its field numbers
with their wire types, and refuses an unknown field, a wrong wire type or a singular field given
twice: protobuf would skip, keep as unknown or overwrite such a record, so the check would read
another model than ONNX Runtime does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum

from qpart.kernels.errors import (
    DigestMismatchError,
    OversizeError,
    TruncatedError,
    UnsafeSegmentError,
    WireFormatError,
)
from qpart.kernels.protobuf import FIXED32, FIXED64, LENGTH, VARINT, check_packed, fields, message, text


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
_ORT_FORMAT_MARK = b"ORTM"  # ONNX Runtime's file identifier of its flatbuffer format

# The fields of onnx.proto (ONNX 1.17) a segment may hold, per message: ``number: (name, wire type,
# repeated)``. A repeated scalar may also come packed (wire type LENGTH). Anything else is refused:
# a field the check does not know is one it cannot vouch for, a wire type protobuf would not read
# as the declared field makes the check read another value than ONNX Runtime does, and a singular
# field twice would be "the last one wins" in protobuf.
_Schema = dict[int, tuple[str, int, bool]]
_MODEL: _Schema = {1: ("ir_version", VARINT, False), 2: ("producer_name", LENGTH, False),
                   3: ("producer_version", LENGTH, False), 4: ("domain", LENGTH, False),
                   5: ("model_version", VARINT, False), 6: ("doc_string", LENGTH, False),
                   7: ("graph", LENGTH, False), 8: ("opset_import", LENGTH, True),
                   14: ("metadata_props", LENGTH, True)}
_MODEL_REFUSED = {20: "training information", 25: "local functions (a custom operator domain)"}
_OPSET: _Schema = {1: ("domain", LENGTH, False), 2: ("version", VARINT, False)}
_ENTRY: _Schema = {1: ("key", LENGTH, False), 2: ("value", LENGTH, False)}
_GRAPH: _Schema = {1: ("node", LENGTH, True), 2: ("name", LENGTH, False), 5: ("initializer", LENGTH, True),
                   10: ("doc_string", LENGTH, False), 11: ("input", LENGTH, True),
                   12: ("output", LENGTH, True), 13: ("value_info", LENGTH, True)}
_GRAPH_REFUSED = {15: "sparse initializers"}
_NODE: _Schema = {1: ("input", LENGTH, True), 2: ("output", LENGTH, True), 3: ("name", LENGTH, False),
                  4: ("op_type", LENGTH, False), 5: ("attribute", LENGTH, True),
                  6: ("doc_string", LENGTH, False), 7: ("domain", LENGTH, False)}
_ATTR: _Schema = {1: ("name", LENGTH, False), 2: ("f", FIXED32, False), 3: ("i", VARINT, False),
                  4: ("s", LENGTH, False), 7: ("floats", FIXED32, True), 8: ("ints", VARINT, True),
                  9: ("strings", LENGTH, True), 13: ("doc_string", LENGTH, False),
                  20: ("type", VARINT, False)}
_ATTR_CARRIES = {5: "a tensor", 6: "a graph", 10: "tensors", 11: "graphs", 14: "a type", 15: "types",
                 22: "a sparse tensor", 23: "sparse tensors"}
_TENSOR: _Schema = {1: ("dims", VARINT, True), 2: ("data_type", VARINT, False),
                    4: ("float_data", FIXED32, True), 5: ("int32_data", VARINT, True),
                    7: ("int64_data", VARINT, True), 8: ("name", LENGTH, False),
                    9: ("raw_data", LENGTH, False), 10: ("double_data", FIXED64, True),
                    11: ("uint64_data", VARINT, True), 12: ("doc_string", LENGTH, False),
                    13: ("external_data", LENGTH, True), 14: ("data_location", VARINT, False)}
_VALUE_INFO: _Schema = {1: ("name", LENGTH, False), 2: ("type", LENGTH, False),
                        3: ("doc_string", LENGTH, False)}
_TYPE: _Schema = {1: ("tensor_type", LENGTH, False), 6: ("denotation", LENGTH, False)}
_TENSOR_TYPE: _Schema = {1: ("elem_type", VARINT, False), 2: ("shape", LENGTH, False)}
_SHAPE: _Schema = {1: ("dim", LENGTH, True)}
_DIM: _Schema = {1: ("dim_value", VARINT, False), 2: ("dim_param", LENGTH, False),
                 3: ("denotation", LENGTH, False)}


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
    node_ops: tuple[tuple[str, str], ...] = field(default=())
    """``(op_type, domain)`` of each node, in order."""
    opset_domains: tuple[str, ...] = field(default=())
    """The domain of each ``opset_import``, in order."""


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
        return _walk_model(memoryview(data), limits)
    except (TruncatedError, OversizeError, UnsafeSegmentError):
        raise
    except WireFormatError as exc:
        raise WireFormatError(f"ONNX segment does not parse: {exc}") from exc


def _records(msg: memoryview, schema: _Schema, what: str,
             refused: dict[int, str] | None = None) -> Iterator[tuple[int, int, int | memoryview]]:
    """The records of one message, each checked against ``schema`` (see above)."""
    seen: set[int] = set()
    for number, wire, value in fields(msg):
        if refused and number in refused:
            raise UnsafeSegmentError(f"ONNX segment carries {refused[number]} ({what} field {number})")
        spec = schema.get(number)
        if spec is None:
            raise UnsafeSegmentError(f"ONNX segment has field {number} of {what}, which the check does "
                                     "not allow")
        name, expected, repeated = spec
        if wire != expected:
            if not (repeated and expected != LENGTH and wire == LENGTH):
                raise WireFormatError(f"{what}.{name} has wire type {wire}, not {expected}")
            check_packed(message(wire, value, f"{what}.{name}"), expected, f"{what}.{name}")
        if not repeated:
            if number in seen:
                raise WireFormatError(f"{what}.{name} appears more than once")
            seen.add(number)
        yield number, wire, value


def _walk_model(data: memoryview, limits: OnnxSegmentLimits) -> OnnxSegmentInfo:
    graph: memoryview | None = None
    metadata: dict[str, str] = {}
    domains: list[str] = []
    producer = {2: "", 3: ""}
    for number, wire, value in _records(data, _MODEL, "ModelProto", _MODEL_REFUSED):
        if number in producer:
            producer[number] = text(wire, value, "producer")
        elif number == 8:
            opset = _strings(message(wire, value, "opset_import"), _OPSET, "OperatorSetIdProto")
            domain = opset.get(1, "")
            if domain not in _DEFAULT_DOMAINS:
                raise UnsafeSegmentError(f"ONNX segment imports the custom operator domain {_shown(domain)}")
            domains.append(domain)
        elif number == 7:
            graph = message(wire, value, "graph")
        elif number == 14:
            entry = _strings(message(wire, value, "metadata_props"), _ENTRY, "StringStringEntryProto")
            key = entry.get(1, "")
            if key in metadata:
                raise WireFormatError(f"metadata key {_shown(key)} appears more than once")
            metadata[key] = entry.get(2, "")
    if graph is None:
        raise WireFormatError("the model has no graph")
    _check_producer(producer[2], producer[3])
    info = _walk_graph(graph, metadata, limits)
    return replace(info, opset_domains=tuple(domains))


def _check_producer(name: str, version: str) -> None:
    if name != ONNX_SEGMENT_FORMAT:
        raise WireFormatError(f"not a qpart ONNX segment (producer {_shown(name)})")
    if version != ONNX_SEGMENT_FORMAT_VERSION:
        raise WireFormatError(f"ONNX segment format version {_shown(version)} is not supported (this build "
                              f"reads {ONNX_SEGMENT_FORMAT_VERSION})")


def _walk_graph(graph: memoryview, metadata: dict[str, str], limits: OnnxSegmentLimits) -> OnnxSegmentInfo:
    node_ops: list[tuple[str, str]] = []
    initializers = 0
    inputs: list[str] = []
    outputs: list[str] = []
    for number, wire, value in _records(graph, _GRAPH, "GraphProto", _GRAPH_REFUSED):
        if number == 1:
            if len(node_ops) >= limits.max_nodes:
                raise OversizeError(f"ONNX segment has more than {limits.max_nodes} nodes (the cap)")
            node_ops.append(_check_node(message(wire, value, "node")))
        elif number == 5:
            initializers += 1
            if initializers > limits.max_initializers:
                raise OversizeError(f"ONNX segment has more than {limits.max_initializers} initializers "
                                    "(the cap)")
            _check_tensor(message(wire, value, "initializer"))
        elif number in (11, 12, 13):
            name = _check_value_info(message(wire, value, "value_info"))
            if number != 13:
                (inputs if number == 11 else outputs).append(name)
    ops = frozenset(op for op, _ in node_ops)
    return OnnxSegmentInfo(metadata, ops, len(node_ops), initializers, tuple(inputs), tuple(outputs),
                           tuple(node_ops))


def _check_node(node: memoryview) -> tuple[str, str]:
    op, domain = "", ""
    for number, wire, value in _records(node, _NODE, "NodeProto"):
        if number == 4:
            op = text(wire, value, "op_type")
        elif number == 7:
            domain = text(wire, value, "domain")
        elif number == 5:
            for _ in _records(message(wire, value, "attribute"), _ATTR, "AttributeProto", {
                    n: f"an attribute that carries {what} (subgraphs and attribute tensors are not allowed)"
                    for n, what in _ATTR_CARRIES.items()}):
                pass
    if domain not in _DEFAULT_DOMAINS:
        raise UnsafeSegmentError(
            f"ONNX segment uses operator {_shown(op)} of the custom domain {_shown(domain)}")
    if op not in ALLOWED_OPS:
        raise UnsafeSegmentError(f"ONNX segment uses operator {_shown(op)}, which is not in the allow-list")
    return op, domain


def _check_tensor(tensor: memoryview) -> None:
    name, external = "", False
    for number, wire, value in _records(tensor, _TENSOR, "TensorProto"):
        if number == 8:
            name = text(wire, value, "initializer name")
        elif number == 13 or (number == 14 and value != 0):  # any location but DEFAULT
            external = True
    if external:
        raise UnsafeSegmentError(
            f"ONNX segment initializer {_shown(name)} refers to external data (a file path)")


def _check_value_info(value_info: memoryview) -> str:
    name = ""
    for number, wire, value in _records(value_info, _VALUE_INFO, "ValueInfoProto"):
        if number == 1:
            name = text(wire, value, "value name")
        elif number == 2:
            for t_number, t_wire, t_value in _records(message(wire, value, "type"), _TYPE, "TypeProto"):
                if t_number == 1:
                    _check_tensor_type(message(t_wire, t_value, "tensor_type"))
    return name


def _check_tensor_type(tensor_type: memoryview) -> None:
    for number, wire, value in _records(tensor_type, _TENSOR_TYPE, "TypeProto.Tensor"):
        if number == 2:
            for _, d_wire, d_value in _records(message(wire, value, "shape"), _SHAPE, "TensorShapeProto"):
                for _ in _records(message(d_wire, d_value, "dim"), _DIM, "TensorShapeProto.Dimension"):
                    pass


def _strings(msg: memoryview, schema: _Schema, what: str) -> dict[int, str]:
    """The string fields of a message of strings and ints (each at most once), by number."""
    found: dict[int, str] = {}
    for number, wire, value in _records(msg, schema, what):
        if wire == LENGTH:
            found[number] = text(wire, value, f"{what} field {number}")
    return found


def _shown(name: str, limit: int = 60) -> str:
    """A name read from the segment, quoted and escaped for a one-line message (never raw bytes
    from the network in a log line), cut to ``limit`` characters."""
    return ascii(name[:limit] + ("…" if len(name) > limit else ""))
