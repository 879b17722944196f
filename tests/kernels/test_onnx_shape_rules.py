"""Each operator's shape rule (kernels.onnx_shape_rules), through the check: shapes follow ONNX's
(opset 18) semantics, and a shape a rule cannot determine, or that its operator would not accept,
is refused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qpart.kernels.errors import UnsafeSegmentError
from qpart.kernels.onnx_segment import INPUT_NAME, OUTPUT_NAME
from tests.kernels.onnx_models import check, segment

REFUSED = {
    "a Reshape shape computed, not given": (
        [helper.make_node("Cast", [INPUT_NAME], ["shape"], to=TensorProto.INT64),
         helper.make_node("Reshape", [INPUT_NAME, "shape"], [OUTPUT_NAME])], [], "int64 initializer"),
    "a batch merged by Flatten axis 2": (
        [helper.make_node("Flatten", [INPUT_NAME], [OUTPUT_NAME], axis=2)], [],
                                         "merges the batch"),
    "a batch merged by Reshape (MobileViT's unfold, Swin's windows)": (
        [helper.make_node("Reshape", [INPUT_NAME, "shape"], [OUTPUT_NAME])],
        [numpy_helper.from_array(np.array([-1, 2], np.int64), "shape")],
        r"Reshape \[N, 4\] to \[-1, 2\] merges the batch into another axis \(axis 0 would be N x 2\), "
        "which ONNX devices cannot take"),
    "shapes that do not broadcast": ([helper.make_node("Add", [INPUT_NAME, "w"], [OUTPUT_NAME])],
                                     [numpy_helper.from_array(np.ones(3, np.float32), "w")], "broadcast"),
    "an unknown attribute": ([helper.make_node("Relu", [INPUT_NAME], [OUTPUT_NAME], alpha=1.0)], [],
                             "does not have"),
    "Clip bounds that are not scalars": (
        [helper.make_node("Clip", [INPUT_NAME, "lo", "hi"], [OUTPUT_NAME])],
        [numpy_helper.from_array(np.zeros(4, np.float32), "lo"),
         numpy_helper.from_array(np.array(6.0, np.float32), "hi")], "not scalars"),
    "auto_pad SAME_UPPER": ([helper.make_node("MaxPool", [INPUT_NAME], [OUTPUT_NAME], kernel_shape=[2],
                                              auto_pad="SAME_UPPER")], [], "takes \\[N, C, spatial"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_shape_a_rule_cannot_determine_is_refused(case):
    nodes, inits, message = REFUSED[case]
    with pytest.raises(UnsafeSegmentError, match=message):
        check(segment(nodes, inits))


def test_clip_between_scalar_bounds_keeps_its_input_shape():
    bounds = [numpy_helper.from_array(np.array(v, np.float32), n) for v, n in ((0.0, "lo"), (6.0, "hi"))]
    info = check(segment([helper.make_node("Clip", [INPUT_NAME, "lo", "hi"], [OUTPUT_NAME])], bounds))
    assert info.ops == frozenset({"Clip"})


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
    data = segment(nodes, [w, fc, shape, st, en, ax], input_shape=("N", 1, 11, 11))
    check(data)
    import onnx

    inferred = shape_inference.infer_shapes(onnx.load_from_string(data), strict_mode=True)
    dims = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
            for v in inferred.graph.value_info}
    assert dims["p"] == ["N", 8, 3, 3] and dims["g"] == ["N", 10]
    with pytest.raises(UnsafeSegmentError, match="cannot multiply"):  # one column fewer than onnx's
        fc_short = numpy_helper.from_array(np.ones((10, 71), np.float32), "fc")
        check(segment(nodes, [w, fc_short, shape, st, en, ax], input_shape=("N", 1, 11, 11)))
