"""The layout, normalization and attention operators' shape rules (kernels.onnx_layout_rules), through
the check: each follows ONNX's (opset 18) semantics, the batch of an ``Expand`` comes only from the
input's own ``Shape``, and what a rule cannot determine is refused."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from qpart.kernels.errors import UnsafeSegmentError
from qpart.kernels.onnx_segment import INPUT_NAME, OUTPUT_NAME
from tests.kernels.onnx_models import check, segment


def _i64(name: str, values: list[int]):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _f32(name: str, shape: tuple[int, ...]):
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


# A class token broadcast to the batch and joined to the input's tokens, then attention-style
# layout: Transpose, Split into three, Squeeze, Softmax, LayerNormalization, Unsqueeze.
TOKENS = (
    [helper.make_node("Shape", [INPUT_NAME], ["n"], end=1),
     helper.make_node("Concat", ["n", "one_c"], ["target"], axis=0),
     helper.make_node("Expand", ["cls", "target"], ["tok"]),
     helper.make_node("Concat", ["tok", INPUT_NAME], ["seq"], axis=1),
     helper.make_node("LayerNormalization", ["seq", "g", "b"], ["norm"], epsilon=1e-5),
     helper.make_node("Reshape", ["norm", "r"], ["heads"]),
     helper.make_node("Transpose", ["heads"], ["t"], perm=[2, 0, 1, 3]),
     helper.make_node("Split", ["t", "three"], ["q", "k", "v"], axis=0),
     helper.make_node("Squeeze", ["q", "zero"], ["qs"]),
     helper.make_node("Softmax", ["qs"], ["p"], axis=-1),
     helper.make_node("Unsqueeze", ["p", "zero"], [OUTPUT_NAME])],
    [_i64("one_c", [1, 6]), _f32("cls", (1, 1, 6)), _f32("g", (6,)), _f32("b", (6,)),
     _i64("r", [0, 5, 3, 2]), _i64("three", [1, 1, 1]), _i64("zero", [0])],
)


def test_a_class_token_and_attention_layout_have_onnx_runtimes_shapes():
    data = segment(*TOKENS, input_shape=("N", 4, 6))
    info = check(data)
    assert {"Expand", "Shape", "Split", "Softmax", "LayerNormalization"} <= info.ops
    out = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
        None, {INPUT_NAME: np.ones((3, 4, 6), np.float32)})[0]
    assert out.shape == (1, 3, 5, 2)  # what the check computed: [1, N, 5, 2]


REFUSED = {
    "an Expand shape given as a constant -1": (
        [helper.make_node("Expand", ["cls", "target"], [OUTPUT_NAME])],
        [_f32("cls", (1, 4)), _i64("target", [-1, 4])], "below 1"),
    "a Reshape shape computed by Shape": (
        [helper.make_node("Shape", [INPUT_NAME], ["s"]),
         helper.make_node("Reshape", [INPUT_NAME, "s"], [OUTPUT_NAME])], [], "computed in the graph"),
    "a Transpose perm that is not a permutation": (
        [helper.make_node("Transpose", [INPUT_NAME], [OUTPUT_NAME], perm=[0, 0])], [], "permutation"),
    "a Split that does not add up": (
        [helper.make_node("Split", [INPUT_NAME, "s"], [OUTPUT_NAME, "x"], axis=1)], [_i64("s", [1, 2])],
        "does not divide"),
    "a Split of the batch": (
        [helper.make_node("Split", [INPUT_NAME], [OUTPUT_NAME, "x"], axis=0, num_outputs=2)], [],
        "batch"),
    "a LayerNormalization scale of another size": (
        [helper.make_node("LayerNormalization", [INPUT_NAME, "g"], [OUTPUT_NAME])], [_f32("g", (3,))],
        "broadcast"),
    "a Squeeze of an axis that is not 1": (
        [helper.make_node("Squeeze", [INPUT_NAME, "a"], [OUTPUT_NAME])], [_i64("a", [1])], "not 1"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_shape_a_layout_rule_cannot_determine_is_refused(case):
    nodes, inits, message = REFUSED[case]
    with pytest.raises(UnsafeSegmentError, match=message):
        check(segment(nodes, inits))
