"""The device's check of ONNX segments: each kind of bad segment is refused with its own error."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qpart.kernels.errors import (
    DigestMismatchError,
    OversizeError,
    TruncatedError,
    UnsafeSegmentError,
    WireFormatError,
)
from qpart.kernels.onnx_segment import (
    ALLOWED_OPS,
    INPUT_NAME,
    ONNX_OPSET,
    ONNX_SEGMENT_FORMAT,
    ONNX_SEGMENT_FORMAT_VERSION,
    OUTPUT_NAME,
    OnnxSegmentLimits,
    check_onnx_segment,
)
from tests.kernels.protobuf_records import record, varint


def _model(nodes=None, initializers=None, opsets=(("", ONNX_OPSET),),
           producer=ONNX_SEGMENT_FORMAT) -> onnx.ModelProto:
    nodes = nodes if nodes is not None else [helper.make_node("Add", [INPUT_NAME, "w"], [OUTPUT_NAME])]
    initializers = initializers if initializers is not None else [
        numpy_helper.from_array(np.ones(4, np.float32), "w")]
    graph = helper.make_graph(
        nodes, "", [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets],
                              ir_version=8, producer_name=producer,
                              producer_version=ONNX_SEGMENT_FORMAT_VERSION)
    helper.set_model_props(model, {"model": "m", "version": "v", "cut": "1", "pattern_id": "c1-x"})
    return model


def _bytes(model: onnx.ModelProto) -> tuple[bytes, str]:
    data = model.SerializeToString()
    return data, hashlib.sha256(data).hexdigest()


def test_a_well_formed_segment_passes_and_its_metadata_is_read():
    data, digest = _bytes(_model())
    info = check_onnx_segment(data, digest, size_bytes=len(data))
    assert info.metadata == {"model": "m", "version": "v", "cut": "1", "pattern_id": "c1-x"}
    assert info.ops == {"Add"} and info.nodes == 1 and info.initializers == 1
    assert info.inputs == (INPUT_NAME,) and info.outputs == (OUTPUT_NAME,)


def test_a_truncated_segment_is_refused_as_truncated():
    data, digest = _bytes(_model())
    with pytest.raises(TruncatedError, match="truncated"):
        check_onnx_segment(data[:-10], digest, size_bytes=len(data))


def test_truncated_bytes_that_hash_right_still_do_not_parse():
    data, _ = _bytes(_model())
    cut = data[: len(data) // 2]
    with pytest.raises(WireFormatError, match=r"does not parse|protobuf"):
        check_onnx_segment(cut, hashlib.sha256(cut).hexdigest())


def test_a_segment_that_is_not_the_one_asked_for_is_a_digest_mismatch():
    data, digest = _bytes(_model())
    other = bytearray(data)
    other[-1] ^= 1
    with pytest.raises(DigestMismatchError, match="hashes to"):
        check_onnx_segment(bytes(other), digest, size_bytes=len(data))


def test_external_data_is_refused():
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="/etc/passwd")
    data, digest = _bytes(_model(initializers=[tensor]))
    with pytest.raises(UnsafeSegmentError, match="external data"):
        check_onnx_segment(data, digest)


@pytest.mark.parametrize("where", ["node", "opset"])
def test_a_custom_domain_is_refused(where):
    if where == "node":
        node = helper.make_node("Add", [INPUT_NAME, "w"], [OUTPUT_NAME], domain="com.example")
        model = _model(nodes=[node],
                       opsets=(("", ONNX_OPSET), ("com.example", 1)))
    else:
        model = _model(opsets=(("", ONNX_OPSET), ("com.microsoft", 1)))
    data, digest = _bytes(model)
    with pytest.raises(UnsafeSegmentError, match="custom"):
        check_onnx_segment(data, digest)


@pytest.mark.parametrize("op", ["RandomNormalLike", "If", "Loop", "Einsum"])
def test_an_operator_outside_the_allow_list_is_refused(op):
    assert op not in ALLOWED_OPS
    data, digest = _bytes(_model(nodes=[helper.make_node(op, [INPUT_NAME], [OUTPUT_NAME])]))
    with pytest.raises(UnsafeSegmentError, match=f"'{op}'.*allow-list"):
        check_onnx_segment(data, digest)


def test_an_attribute_that_carries_a_subgraph_is_refused():
    sub = helper.make_graph([], "g", [], [])
    node = helper.make_node("Identity", [INPUT_NAME], [OUTPUT_NAME], body=sub)
    data, digest = _bytes(_model(nodes=[node]))
    with pytest.raises(UnsafeSegmentError, match="graph"):
        check_onnx_segment(data, digest)


@pytest.mark.parametrize(("limits", "what"), [
    (OnnxSegmentLimits(max_bytes=64), "bytes"),
    (OnnxSegmentLimits(max_nodes=3), "nodes"),
    (OnnxSegmentLimits(max_initializers=3), "initializers"),
])
def test_an_oversize_segment_is_refused_before_a_session(limits, what):
    inits = [numpy_helper.from_array(np.ones(4, np.float32), f"w{i}") for i in range(5)]
    nodes = [helper.make_node("Identity", [INPUT_NAME if i == 0 else f"a{i}"],
                              [OUTPUT_NAME if i == 4 else f"a{i + 1}"]) for i in range(5)]
    data, digest = _bytes(_model(nodes=nodes, initializers=inits))
    check_onnx_segment(data, digest)  # within the default caps
    with pytest.raises(OversizeError, match=what):
        check_onnx_segment(data, digest, limits=limits)


def test_a_model_from_another_producer_is_not_a_segment():
    data, digest = _bytes(_model(producer="pytorch"))
    with pytest.raises(WireFormatError, match="not a qpart ONNX segment"):
        check_onnx_segment(data, digest)


def test_every_refusal_is_one_line():
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "w")
    tensor.data_location = TensorProto.EXTERNAL
    disallowed = helper.make_node("If", [INPUT_NAME], [OUTPUT_NAME])
    for model in (_model(initializers=[tensor]), _model(nodes=[disallowed])):
        data, digest = _bytes(model)
        with pytest.raises(WireFormatError) as info:
            check_onnx_segment(data, digest)
        assert "\n" not in str(info.value)


# Parser differentials (issue 25): records the check would read otherwise than protobuf does.



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
    return _model(nodes=[helper.make_node(op, [INPUT_NAME], [OUTPUT_NAME])], initializers=[])


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
    data, digest = _with_node_suffix(_model(nodes=[node], initializers=[]), record(number, payload))
    with pytest.raises(WireFormatError, match="more than once"):
        check_onnx_segment(data, digest)


@pytest.mark.parametrize("number", [8, 9, 10, 99])
def test_an_unknown_node_field_is_refused(number):
    data, digest = _with_node_suffix(_one("Relu"), record(number, b""))
    with pytest.raises(UnsafeSegmentError, match=f"field {number} of NodeProto"):
        check_onnx_segment(data, digest)


@pytest.mark.parametrize(("number", "what"), [(20, "training"), (25, "local functions"), (26, "field 26")])
def test_model_level_fields_outside_the_allow_list_are_refused(number, what):
    data = _model().SerializeToString() + record(number, b"")
    with pytest.raises(UnsafeSegmentError, match=what):
        check_onnx_segment(data, hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("location", [1, 2, 1 << 32 | 1])
def test_a_data_location_other_than_default_is_refused(location):
    # 2**32 + 1 is EXTERNAL to a parser that truncates the enum to 32 bits
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "w").SerializeToString() + varint(
        14 << 3) + varint(location)
    model = _model()
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
