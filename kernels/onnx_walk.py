"""The bounded walk of an ONNX segment's protobuf (ADR 0012), over :mod:`kernels.protobuf`: the
part of :func:`kernels.onnx_segment.check_onnx_segment` that reads the model. Needs neither onnx nor
torch.

The walk reads every message of the model down to the tensor shapes, each against an allow-list of
its field numbers with their wire types, and refuses an unknown field, a wrong wire type or a
singular field given twice: protobuf would skip, keep as unknown or overwrite such a record, so the
check would read another model than ONNX Runtime does. On the way it refuses external data,
operator domains other than ONNX's own, an opset other than 18, operators outside
:data:`~kernels.onnx_format.ALLOWED_OPS`, attributes that carry tensors or graphs or that the
operator lacks, local functions, training info, and more records, nodes, initializers or entries
of any repeated field than the caps of :class:`~kernels.onnx_format.OnnxSegmentLimits`; last, it
hands the graph to the static shapes of :mod:`kernels.onnx_shapes`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import replace

from qpart.kernels.errors import OversizeError, UnsafeSegmentError, WireFormatError
from qpart.kernels.onnx_format import (
    ALLOWED_OPS,
    INPUT_NAME,
    ONNX_OPSET,
    ONNX_SEGMENT_FORMAT,
    ONNX_SEGMENT_FORMAT_VERSION,
    OUTPUT_NAME,
    OnnxSegmentInfo,
    OnnxSegmentLimits,
)
from qpart.kernels.onnx_graph import BATCH, FLOAT, FLOATS, INT, INTS, STRING, Attribute, Initializer, Node
from qpart.kernels.onnx_shape_rules import check_attributes
from qpart.kernels.onnx_shapes import check_shapes
from qpart.kernels.protobuf import (
    FIXED32,
    FIXED64,
    LENGTH,
    VARINT,
    check_packed,
    fields,
    message,
    read_varint,
    text,
)

_DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})
_SMALL = 64  # the most int64_data values an initializer keeps for the shape check

# The fields of onnx.proto (ONNX 1.17) a segment may hold, per message: ``number: (name, wire type,
# repeated)``. A repeated scalar may also come packed (wire type LENGTH). Anything else is refused:
# a field the check does not know is one it cannot vouch for, a wire type protobuf would not read
# as the declared field makes the check read another value than ONNX Runtime does, and a singular
# field twice would be "the last one wins" in protobuf.
_Schema = dict[int, tuple[str, int, bool]]
_Caps = dict[int, tuple[int, str]]  # field number: (the most entries, what they are)
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
_ATTR_REFUSED = {n: f"an attribute that carries {what} (subgraphs and attribute tensors are not allowed)"
                 for n, what in _ATTR_CARRIES.items()}
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


def walk_model(data: memoryview, limits: OnnxSegmentLimits) -> OnnxSegmentInfo:
    """Walk a segment's ModelProto (its bytes) against the allow-lists and ``limits``.

    Raises:
        OversizeError, UnsafeSegmentError, WireFormatError: what was refused, in one line.
    """
    return _Walk(limits).model(data)


class _Walk:
    """One walk of a segment's messages, counting what it reads against the caps."""

    def __init__(self, limits: OnnxSegmentLimits) -> None:
        self.limits = limits
        self.records_left = limits.max_records

    def records(self, msg: memoryview, schema: _Schema, what: str, refused: dict[int, str] | None = None,
                caps: _Caps | None = None) -> Iterator[tuple[int, int, int | memoryview]]:
        """The records of one message, each checked against ``schema`` (see above); ``caps``: the
        most entries of a repeated field (a packed array's elements count each), and what they are."""
        seen: set[int] = set()
        counts: dict[int, int] = {}
        for number, wire, value in fields(msg):
            self.records_left -= 1
            if self.records_left < 0:
                raise OversizeError(f"ONNX segment has more than {self.limits.max_records} protobuf "
                                    "records (the cap)")
            if refused and number in refused:
                raise UnsafeSegmentError(f"ONNX segment carries {refused[number]} ({what} field {number})")
            spec = schema.get(number)
            if spec is None:
                raise UnsafeSegmentError(f"ONNX segment has field {number} of {what}, which the check "
                                         "does not allow")
            name, expected, repeated = spec
            entries = _entries(wire, value, expected, repeated, f"{what}.{name}")
            if not repeated:
                if number in seen:
                    raise WireFormatError(f"{what}.{name} appears more than once")
                seen.add(number)
            elif caps and number in caps:
                counts[number] = counts.get(number, 0) + entries
                if counts[number] > caps[number][0]:
                    raise OversizeError(f"ONNX segment has more than {caps[number][0]} {caps[number][1]} "
                                        "(the cap)")
            yield number, wire, value

    def model(self, data: memoryview) -> OnnxSegmentInfo:
        graph: memoryview | None = None
        metadata: dict[str, str] = {}
        domains: list[str] = []
        producer = {2: "", 3: ""}
        caps = {8: (self.limits.max_graph_values, "opset imports"),
                14: (self.limits.max_metadata, "metadata entries")}
        for number, wire, value in self.records(data, _MODEL, "ModelProto", _MODEL_REFUSED, caps):
            if number in producer:
                producer[number] = text(wire, value, "producer")
            elif number == 8:
                domains.append(self.opset(message(wire, value, "opset_import"), domains))
            elif number == 7:
                graph = message(wire, value, "graph")
            elif number == 14:
                entry = self.strings(message(wire, value, "metadata_props"), _ENTRY, "StringStringEntryProto")
                key = entry.get(1, "")
                if key in metadata:
                    raise WireFormatError(f"metadata key {_shown(key)} appears more than once")
                metadata[key] = entry.get(2, "")
        if graph is None:
            raise WireFormatError("the model has no graph")
        if not domains:
            raise UnsafeSegmentError("ONNX segment imports no opset")
        _check_producer(producer[2], producer[3])
        info = self.graph(graph, metadata)
        return replace(info, opset_domains=tuple(domains))

    def opset(self, msg: memoryview, domains: list[str]) -> str:
        domain, version = "", 0
        for number, wire, value in self.records(msg, _OPSET, "OperatorSetIdProto"):
            if number == 1:
                domain = text(wire, value, "opset domain")
            else:
                version = int(value)
        if domain not in _DEFAULT_DOMAINS:
            raise UnsafeSegmentError(f"ONNX segment imports the custom operator domain {_shown(domain)}")
        if domains:  # "" and "ai.onnx" are one domain
            raise UnsafeSegmentError("ONNX segment imports ONNX's operator set twice")
        if version != ONNX_OPSET:  # the shapes are computed with opset 18's semantics
            raise UnsafeSegmentError(f"ONNX segment imports opset {version}, not {ONNX_OPSET}")
        return domain

    def graph(self, graph: memoryview, metadata: dict[str, str]) -> OnnxSegmentInfo:
        limits = self.limits
        nodes: list[Node] = []
        node_ops: list[tuple[str, str]] = []
        initializers: list[Initializer] = []
        values: dict[int, list[tuple[str, tuple[int | str | None, ...] | None]]] = {11: [], 12: [], 13: []}
        caps = {1: (limits.max_nodes, "nodes"), 5: (limits.max_initializers, "initializers"),
                11: (limits.max_graph_values, "graph inputs"), 12: (limits.max_graph_values, "graph outputs"),
                13: (limits.max_nodes, "value_info entries")}
        for number, wire, value in self.records(graph, _GRAPH, "GraphProto", _GRAPH_REFUSED, caps):
            if number == 1:
                op, domain, node = self.node(message(wire, value, "node"))
                node_ops.append((op, domain))
                nodes.append(node)
            elif number == 5:
                initializers.append(self.tensor(message(wire, value, "initializer")))
            elif number in values:
                values[number].append(self.value_info(message(wire, value, "value_info")))
        inputs, outputs = tuple(v[0] for v in values[11]), tuple(v[0] for v in values[12])
        size = check_shapes(INPUT_NAME, _input_dims(values[11]), initializers, nodes, OUTPUT_NAME,
                            max_elements=limits.max_tensor_elements, max_total=limits.max_total_elements,
                            max_flops=limits.max_flops)
        ops = frozenset(op for op, _ in node_ops)
        return OnnxSegmentInfo(metadata, ops, len(nodes), len(initializers), inputs, outputs, tuple(node_ops),
                               flops=size.flops)

    def node(self, msg: memoryview) -> tuple[str, str, Node]:
        op, domain = "", ""
        inputs: list[str] = []
        outputs: list[str] = []
        attributes: dict[str, Attribute] = {}
        caps = {1: (self.limits.max_node_values, "inputs of a node"),
                2: (self.limits.max_node_values, "outputs of a node"),
                5: (self.limits.max_attributes, "attributes of a node")}
        for number, wire, value in self.records(msg, _NODE, "NodeProto", caps=caps):
            if number == 4:
                op = text(wire, value, "op_type")
            elif number == 7:
                domain = text(wire, value, "domain")
            elif number in (1, 2):
                (inputs if number == 1 else outputs).append(text(wire, value, "node value name"))
            elif number == 5:
                attr = self.attribute(message(wire, value, "attribute"))
                if attr.name in attributes:
                    raise WireFormatError(f"attribute {_shown(attr.name)} appears twice in one node")
                attributes[attr.name] = attr
        if domain not in _DEFAULT_DOMAINS:
            raise UnsafeSegmentError(
                f"ONNX segment uses operator {_shown(op)} of the custom domain {_shown(domain)}")
        if op not in ALLOWED_OPS:
            raise UnsafeSegmentError(f"ONNX segment uses operator {_shown(op)}, which is not in the "
                                     "allow-list")
        check_attributes(op, attributes)
        return op, domain, Node(op, tuple(inputs), tuple(outputs), attributes)

    def attribute(self, msg: memoryview) -> Attribute:
        found: dict[int, int | memoryview] = {}
        ints: list[int] = []
        cap = (self.limits.max_attribute_values, "values of an attribute")
        for number, _wire, value in self.records(msg, _ATTR, "AttributeProto", _ATTR_REFUSED,
                                                 {7: cap, 8: cap, 9: cap}):
            if number == 8:
                ints.extend(_varints(value))
            else:
                found[number] = value
        kind = int(found.get(20, 0))
        # ORT reads the field of the declared type: only that one may be set.
        fields_of = {FLOAT: {2}, INT: {3}, STRING: {4}, FLOATS: {7}, INTS: {8}}
        extra = {n for n in found if n not in (1, 13, 20)} | ({8} if ints else set())
        if kind not in fields_of or not extra <= fields_of[kind]:
            raise WireFormatError(f"attribute of type {kind} with the fields {sorted(extra)}")
        name = text(LENGTH, found.get(1, memoryview(b"")), "attribute name")
        f_value = found.get(2)
        f = struct.unpack("<f", f_value)[0] if isinstance(f_value, memoryview) else 0.0
        s = text(LENGTH, found[4], "attribute string") if 4 in found else ""
        return Attribute(name, kind, i=_signed(int(found.get(3, 0))), f=f, s=s, ints=tuple(ints))

    def tensor(self, msg: memoryview) -> Initializer:
        name, external, data_type = "", False, 0
        dims: list[int] = []
        raw: memoryview | None = None
        int64: list[int] = []
        for number, wire, value in self.records(msg, _TENSOR, "TensorProto", caps=self.dims_cap()):
            if number == 8:
                name = text(wire, value, "initializer name")
            elif number == 1:
                dims.extend(_varints(value))
            elif number == 2:
                data_type = int(value)
            elif number == 9:
                raw = message(wire, value, "raw_data")
            elif number == 7 and len(int64) <= _SMALL:  # more values than the shapes read: not kept
                int64.extend(_varints(value) if isinstance(value, int) or len(value) <= 10 * _SMALL
                             else [0] * (_SMALL + 1))
            elif number == 13 or (number == 14 and value != 0):  # any location but DEFAULT
                external = True
        if external:
            raise UnsafeSegmentError(
                f"ONNX segment initializer {_shown(name)} refers to external data (a file path)")
        return Initializer(name, tuple(map(_signed, dims)), data_type, raw, tuple(map(_signed, int64)))

    def value_info(self, msg: memoryview) -> tuple[str, tuple[int | str | None, ...] | None]:
        name, dims = "", None
        for number, wire, value in self.records(msg, _VALUE_INFO, "ValueInfoProto"):
            if number == 1:
                name = text(wire, value, "value name")
            elif number == 2:
                for t_number, t_wire, t_value in self.records(message(wire, value, "type"), _TYPE,
                                                              "TypeProto"):
                    if t_number == 1:
                        dims = self.tensor_type(message(t_wire, t_value, "tensor_type"))
        return name, dims

    def tensor_type(self, msg: memoryview) -> tuple[int | str | None, ...] | None:
        dims: list[int | str | None] | None = None
        for number, wire, value in self.records(msg, _TENSOR_TYPE, "TypeProto.Tensor"):
            if number == 2:
                dims = []
                for _n, d_wire, d_value in self.records(message(wire, value, "shape"), _SHAPE,
                                                       "TensorShapeProto", caps=self.dims_cap()):
                    dim: int | str | None = None
                    for n, w, v in self.records(message(d_wire, d_value, "dim"), _DIM,
                                                "TensorShapeProto.Dimension"):
                        if n in (1, 2):
                            dim = _signed(int(v)) if n == 1 else text(w, v, "dim_param")
                    dims.append(dim)
        return None if dims is None else tuple(dims)

    def dims_cap(self) -> _Caps:
        return {1: (self.limits.max_dims, "dimensions of a shape")}

    def strings(self, msg: memoryview, schema: _Schema, what: str) -> dict[int, str]:
        """The string fields of a message of strings and ints (each at most once), by number."""
        found: dict[int, str] = {}
        for number, wire, value in self.records(msg, schema, what):
            if wire == LENGTH:
                found[number] = text(wire, value, f"{what} field {number}")
        return found


def _entries(wire: int, value: int | memoryview, expected: int, repeated: bool, what: str) -> int:
    """How many values a record holds: 1, or a packed array's elements (checked)."""
    if wire == expected:
        return 1
    if not (repeated and expected != LENGTH and wire == LENGTH):
        raise WireFormatError(f"{what} has wire type {wire}, not {expected}")
    return check_packed(message(wire, value, what), expected, what)


def _input_dims(inputs: list[tuple[str, tuple[int | str | None, ...] | None]]) -> tuple[int, ...]:
    """The shape of the graph's one input, ``[N, ...]``: a named batch dimension first, then sizes."""
    if [name for name, _ in inputs] != [INPUT_NAME]:
        raise UnsafeSegmentError(f"ONNX segment's graph inputs are {[_shown(n) for n, _ in inputs]}, not "
                                 f"['{INPUT_NAME}']")
    dims = inputs[0][1]
    if not dims or any(not isinstance(d, int) or d < 0 for d in dims[1:]) or dims[0] is None \
            or (isinstance(dims[0], int) and dims[0] < 0):
        raise UnsafeSegmentError(f"ONNX segment's input has no static shape [N, ...] ({dims})")
    return tuple(BATCH if isinstance(d, str) else d for d in dims)  # type: ignore[misc]


def _varints(value: int | memoryview) -> list[int]:
    """One varint record's value, or a packed array's (checked by check_packed already)."""
    if isinstance(value, int):
        return [value]
    out, pos = [], 0
    while pos < len(value):
        v, pos = read_varint(value, pos)
        out.append(v)
    return out


def _signed(value: int) -> int:
    """An int64 field's varint as protobuf reads it (two's complement)."""
    return value - (1 << 64) if value >> 63 else value


def _check_producer(name: str, version: str) -> None:
    if name != ONNX_SEGMENT_FORMAT:
        raise WireFormatError(f"not a qpart ONNX segment (producer {_shown(name)})")
    if version != ONNX_SEGMENT_FORMAT_VERSION:
        raise WireFormatError(f"ONNX segment format version {_shown(version)} is not supported (this build "
                              f"reads {ONNX_SEGMENT_FORMAT_VERSION})")


def _shown(name: str, limit: int = 60) -> str:
    """A name read from the segment, quoted and escaped for a one-line message (never raw bytes
    from the network in a log line), cut to ``limit`` characters."""
    return ascii(name[:limit] + ("…" if len(name) > limit else ""))
