"""The check's static sizes (kernels.onnx_shapes): a graph of allowed operators that would make a
huge tensor is refused before ONNX Runtime folds or runs it; every real segment is accepted."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qpart.kernels.errors import OversizeError, UnsafeSegmentError
from qpart.kernels.onnx_segment import (
    INPUT_NAME,
    ONNX_OPSET,
    ONNX_SEGMENT_FORMAT,
    ONNX_SEGMENT_FORMAT_VERSION,
    OUTPUT_NAME,
    OnnxSegmentLimits,
    check_onnx_segment,
)


def _segment(nodes, initializers, input_shape=("N", 4), opset=ONNX_OPSET) -> bytes:
    graph = helper.make_graph(
        nodes, "", [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8,
                              producer_name=ONNX_SEGMENT_FORMAT, producer_version=ONNX_SEGMENT_FORMAT_VERSION)
    helper.set_model_props(model, {"model": "m", "version": "v", "cut": "1", "pattern_id": "c1-x"})
    return model.SerializeToString()


def _check(data: bytes, limits: OnnxSegmentLimits | None = None):
    return check_onnx_segment(data, hashlib.sha256(data).hexdigest(), limits=limits)


def _concat_bomb(k: int) -> bytes:
    """The review's bomb: k Concat(x, x) over one float, sliced back to 4 values (about 1 KB)."""
    nodes = [helper.make_node("Concat", [f"c{i}", f"c{i}"], [f"c{i + 1}"], axis=0) for i in range(k)]
    nodes += [helper.make_node("Slice", [f"c{k}", "st", "en"], ["s"]),
              helper.make_node("Add", [INPUT_NAME, "s"], [OUTPUT_NAME])]
    inits = [numpy_helper.from_array(np.ones(1, np.float32), "c0"),
             numpy_helper.from_array(np.array([0], np.int64), "st"),
             numpy_helper.from_array(np.array([4], np.int64), "en")]
    return _segment(nodes, inits)


def test_a_short_concat_chain_passes():
    assert _check(_concat_bomb(4)).ops == {"Concat", "Slice", "Add"}


@pytest.mark.parametrize("k", [25, 40])
def test_the_concat_bomb_is_refused_naming_the_node_and_its_size(k):
    data = _concat_bomb(k)
    assert len(data) < 4096
    with pytest.raises(OversizeError, match=r"node 24 \(Concat -> 'c25'\) makes a tensor of 33554432 "
                                            r"elements per sample, over the cap of 16777216"):
        _check(data)


def test_a_bomb_through_the_batch_is_counted_per_sample():
    nodes = [helper.make_node("Concat", [f"c{i}", f"c{i}"], [f"c{i + 1}"], axis=1) for i in range(23)]
    nodes[0].input[:] = [INPUT_NAME, INPUT_NAME]
    nodes.append(helper.make_node("Identity", ["c23"], [OUTPUT_NAME]))
    with pytest.raises(OversizeError, match=r"node 21 .* 16777216 elements per sample"):
        _check(_segment(nodes, []), OnnxSegmentLimits(max_tensor_elements=(1 << 24) - 1))


REFUSED = {
    "out of topological order": ([helper.make_node("Relu", ["r"], [OUTPUT_NAME]),
                                  helper.make_node("Relu", [INPUT_NAME], ["r"])], [], "topological order"),
    "a value made twice": ([helper.make_node("Relu", [INPUT_NAME], [OUTPUT_NAME]),
                            helper.make_node("Relu", [INPUT_NAME], [OUTPUT_NAME])], [], "again"),
    "a Reshape shape computed, not given": (
        [helper.make_node("Cast", [INPUT_NAME], ["shape"], to=TensorProto.INT64),
         helper.make_node("Reshape", [INPUT_NAME, "shape"], [OUTPUT_NAME])], [], "int64 initializer"),
    "a batch merged by Flatten axis 2": (
        [helper.make_node("Flatten", [INPUT_NAME], [OUTPUT_NAME], axis=2)], [],
                                         "merges the batch"),
    "shapes that do not broadcast": ([helper.make_node("Add", [INPUT_NAME, "w"], [OUTPUT_NAME])],
                                     [numpy_helper.from_array(np.ones(3, np.float32), "w")], "broadcast"),
    "an unknown attribute": ([helper.make_node("Relu", [INPUT_NAME], [OUTPUT_NAME], alpha=1.0)], [],
                             "does not have"),
    "auto_pad SAME_UPPER": ([helper.make_node("MaxPool", [INPUT_NAME], [OUTPUT_NAME], kernel_shape=[2],
                                              auto_pad="SAME_UPPER")], [], "takes \\[N, C, spatial"),
    "the output never made": ([helper.make_node("Relu", [INPUT_NAME], ["r"])], [], "never makes"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_shape_the_check_cannot_determine_is_refused(case):
    nodes, inits, message = REFUSED[case]
    with pytest.raises(UnsafeSegmentError, match=message):
        _check(_segment(nodes, inits))


def test_an_input_without_a_static_shape_or_another_opset_is_refused():
    relu = [helper.make_node("Relu", [INPUT_NAME], [OUTPUT_NAME])]
    with pytest.raises(UnsafeSegmentError, match="static shape"):
        _check(_segment(relu, [], input_shape=("N", "C")))
    with pytest.raises(UnsafeSegmentError, match="opset 17, not 18"):
        _check(_segment(relu, [], opset=17))


def test_shapes_follow_onnx_semantics_on_a_small_cnn():
    """Conv, MaxPool, Flatten, Gemm, Reshape with 0 and -1, Slice: the check's shapes are onnx's."""
    from onnx import shape_inference

    w = numpy_helper.from_array(np.ones((8, 1, 3, 3), np.float32), "w")
    fc = numpy_helper.from_array(np.ones((10, 8 * 3 * 3), np.float32), "fc")
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")
    st, en = (numpy_helper.from_array(np.array([v], np.int64), n) for v, n in ((1, "st"), (9, "en")))
    ax = numpy_helper.from_array(np.array([1], np.int64), "ax")
    nodes = [helper.make_node("Conv", [INPUT_NAME, "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
             helper.make_node("Flatten", ["p"], ["f"], axis=1),
             helper.make_node("Gemm", ["f", "fc"], ["g"], transB=1),
             helper.make_node("Reshape", ["g", "shape"], ["r"]),
             helper.make_node("Slice", ["r", "st", "en", "ax"], [OUTPUT_NAME])]
    data = _segment(nodes, [w, fc, shape, st, en, ax], input_shape=("N", 1, 11, 11))
    _check(data)
    import onnx

    inferred = shape_inference.infer_shapes(onnx.load_from_string(data), strict_mode=True)
    dims = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
            for v in inferred.graph.value_info}
    assert dims["p"] == ["N", 8, 3, 3] and dims["g"] == ["N", 10]
    with pytest.raises(UnsafeSegmentError, match="cannot multiply"):  # one column fewer than onnx's
        fc_short = numpy_helper.from_array(np.ones((10, 71), np.float32), "fc")
        _check(_segment(nodes, [w, fc_short, shape, st, en, ax], input_shape=("N", 1, 11, 11)))
