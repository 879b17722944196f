"""The walk of an ONNX segment's protobuf (kernels.onnx_walk), through the check: parser
differentials (issue 25), records the check would read otherwise than protobuf or ONNX Runtime
does, are refused."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qpart.kernels.errors import UnsafeSegmentError, WireFormatError
from qpart.kernels.onnx_segment import INPUT_NAME, OUTPUT_NAME, check_onnx_segment
from tests.kernels.onnx_models import segment_model
from tests.kernels.protobuf_records import record, varint


def _with_node_suffix(model: onnx.ModelProto, suffix: bytes, *, parses: bool = True) -> tuple[bytes, str]:
    """The model's bytes with ``suffix`` appended to its (only) node's record (``parses``: Python's
    protobuf reads them; it refuses tags over 32 bits, which ONNX Runtime's C++ protobuf truncates)."""
    node = model.graph.node[0].SerializeToString()
    graph = model.graph.SerializeToString()
    whole = model.SerializeToString()
    new_graph = graph.replace(record(1, node), record(1, node + suffix))
    data = whole.replace(record(7, graph), record(7, new_graph))
    assert data != whole
    if parses:
        assert onnx.load_from_string(data)
    return data, hashlib.sha256(data).hexdigest()


def _one(op: str) -> onnx.ModelProto:
    return segment_model(nodes=[helper.make_node(op, [INPUT_NAME], [OUTPUT_NAME])], initializers=[])


def test_a_tag_wider_than_32_bits_is_refused():
    # ONNX Runtime's protobuf drops the bits above 32: to it this record is op_type "Sin"
    data, digest = _with_node_suffix(_one("Relu"), record(4, b"Sin", tag=1 << 32 | 4 << 3 | 2),
                                     parses=False)
    with pytest.raises(WireFormatError, match="32 bits"):
        check_onnx_segment(data, digest)


def test_a_tag_longer_than_5_bytes_is_refused():
    long_tag = bytes([0x80 | (4 << 3 | 2), 0x80, 0x80, 0x80, 0x80, 0x00])  # 34 padded to 6 bytes
    data, digest = _with_node_suffix(_one("Relu"), long_tag + varint(3) + b"Sin", parses=False)
    with pytest.raises(WireFormatError, match="longer than 5 bytes"):
        check_onnx_segment(data, digest)


def test_an_op_type_of_the_wrong_wire_type_is_refused():
    # a fixed32 field 4 is an unknown field to protobuf, which keeps the real op_type (Sin)
    data, digest = _with_node_suffix(_one("Sin"), varint(4 << 3 | 5) + b"Relu")
    assert onnx.load_from_string(data).graph.node[0].op_type == "Sin"
    with pytest.raises(WireFormatError, match="wire type 5"):
        check_onnx_segment(data, digest)


@pytest.mark.parametrize(("number", "payload"), [(4, b"Relu"), (7, b"")])
def test_a_singular_field_given_twice_is_refused(number, payload):
    # protobuf keeps the last: the check must not have to guess which one ONNX Runtime reads
    node = helper.make_node("Relu", [INPUT_NAME], [OUTPUT_NAME], domain="")
    data, digest = _with_node_suffix(segment_model(nodes=[node], initializers=[]), record(number, payload))
    with pytest.raises(WireFormatError, match="more than once"):
        check_onnx_segment(data, digest)


@pytest.mark.parametrize("number", [8, 9, 10, 99])
def test_an_unknown_node_field_is_refused(number):
    data, digest = _with_node_suffix(_one("Relu"), record(number, b""))
    with pytest.raises(UnsafeSegmentError, match=f"field {number} of NodeProto"):
        check_onnx_segment(data, digest)


@pytest.mark.parametrize(("number", "what"), [(20, "training"), (25, "local functions"), (26, "field 26")])
def test_model_level_fields_outside_the_allow_list_are_refused(number, what):
    data = segment_model().SerializeToString() + record(number, b"")
    with pytest.raises(UnsafeSegmentError, match=what):
        check_onnx_segment(data, hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("location", [1, 2, 1 << 32 | 1])
def test_a_data_location_other_than_default_is_refused(location):
    # 2**32 + 1 is EXTERNAL to a parser that truncates the enum to 32 bits
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "w").SerializeToString() + varint(
        14 << 3) + varint(location)
    model = segment_model()
    graph = model.graph.SerializeToString()
    init = model.graph.initializer[0].SerializeToString()
    whole = model.SerializeToString()
    data = whole.replace(record(7, graph), record(7, graph.replace(record(5, init), record(5, tensor))))
    with pytest.raises(UnsafeSegmentError, match="external data"):
        check_onnx_segment(data, hashlib.sha256(data).hexdigest())


def test_a_non_tag_varint_above_64_bits_is_refused():
    from qpart.kernels.protobuf import read_varint
    with pytest.raises(WireFormatError, match="64 bits"):
        read_varint(memoryview(b"\xff" * 9 + b"\x02"), 0)
    assert read_varint(memoryview(b"\xff" * 9 + b"\x01"), 0) == ((1 << 64) - 1, 10)
