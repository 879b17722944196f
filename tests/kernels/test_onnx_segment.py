"""The device's check of ONNX segments: each kind of bad segment is refused with its own error."""

from __future__ import annotations

import hashlib

import numpy as np
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
    OUTPUT_NAME,
    OnnxSegmentLimits,
    check_onnx_segment,
)
from tests.kernels.onnx_models import segment_model, with_digest


def test_a_well_formed_segment_passes_and_its_metadata_is_read():
    data, digest = with_digest(segment_model())
    info = check_onnx_segment(data, digest, size_bytes=len(data))
    assert info.metadata == {"model": "m", "version": "v", "cut": "1", "pattern_id": "c1-x"}
    assert info.ops == {"Add"} and info.nodes == 1 and info.initializers == 1
    assert info.inputs == (INPUT_NAME,) and info.outputs == (OUTPUT_NAME,)


def test_a_truncated_segment_is_refused_as_truncated():
    data, digest = with_digest(segment_model())
    with pytest.raises(TruncatedError, match="truncated"):
        check_onnx_segment(data[:-10], digest, size_bytes=len(data))


def test_truncated_bytes_that_hash_right_still_do_not_parse():
    data, _ = with_digest(segment_model())
    cut = data[: len(data) // 2]
    with pytest.raises(WireFormatError, match=r"does not parse|protobuf"):
        check_onnx_segment(cut, hashlib.sha256(cut).hexdigest())


def test_a_segment_that_is_not_the_one_asked_for_is_a_digest_mismatch():
    data, digest = with_digest(segment_model())
    other = bytearray(data)
    other[-1] ^= 1
    with pytest.raises(DigestMismatchError, match="hashes to"):
        check_onnx_segment(bytes(other), digest, size_bytes=len(data))


def test_external_data_is_refused():
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="/etc/passwd")
    data, digest = with_digest(segment_model(initializers=[tensor]))
    with pytest.raises(UnsafeSegmentError, match="external data"):
        check_onnx_segment(data, digest)


@pytest.mark.parametrize("where", ["node", "opset"])
def test_a_custom_domain_is_refused(where):
    if where == "node":
        node = helper.make_node("Add", [INPUT_NAME, "w"], [OUTPUT_NAME], domain="com.example")
        model = segment_model(nodes=[node],
                       opsets=(("", ONNX_OPSET), ("com.example", 1)))
    else:
        model = segment_model(opsets=(("", ONNX_OPSET), ("com.microsoft", 1)))
    data, digest = with_digest(model)
    with pytest.raises(UnsafeSegmentError, match="custom"):
        check_onnx_segment(data, digest)


@pytest.mark.parametrize("op", ["RandomNormalLike", "If", "Loop", "Einsum"])
def test_an_operator_outside_the_allow_list_is_refused(op):
    assert op not in ALLOWED_OPS
    data, digest = with_digest(segment_model(nodes=[helper.make_node(op, [INPUT_NAME], [OUTPUT_NAME])]))
    with pytest.raises(UnsafeSegmentError, match=f"'{op}'.*allow-list"):
        check_onnx_segment(data, digest)


def test_an_attribute_that_carries_a_subgraph_is_refused():
    sub = helper.make_graph([], "g", [], [])
    node = helper.make_node("Identity", [INPUT_NAME], [OUTPUT_NAME], body=sub)
    data, digest = with_digest(segment_model(nodes=[node]))
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
    data, digest = with_digest(segment_model(nodes=nodes, initializers=inits))
    check_onnx_segment(data, digest)  # within the default caps
    with pytest.raises(OversizeError, match=what):
        check_onnx_segment(data, digest, limits=limits)


def test_a_model_from_another_producer_is_not_a_segment():
    data, digest = with_digest(segment_model(producer="pytorch"))
    with pytest.raises(WireFormatError, match="not a qpart ONNX segment"):
        check_onnx_segment(data, digest)


def test_every_refusal_is_one_line():
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "w")
    tensor.data_location = TensorProto.EXTERNAL
    disallowed = helper.make_node("If", [INPUT_NAME], [OUTPUT_NAME])
    for model in (segment_model(initializers=[tensor]), segment_model(nodes=[disallowed])):
        data, digest = with_digest(model)
        with pytest.raises(WireFormatError) as info:
            check_onnx_segment(data, digest)
        assert "\n" not in str(info.value)
