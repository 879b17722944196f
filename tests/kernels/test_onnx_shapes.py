"""The check's static sizes (kernels.onnx_shapes): a graph of allowed operators that would make a
huge tensor is refused before ONNX Runtime folds or runs it; every real segment is accepted."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from qpart.kernels.errors import OversizeError, UnsafeSegmentError
from qpart.kernels.onnx_segment import INPUT_NAME, OUTPUT_NAME, OnnxSegmentLimits
from tests.kernels.onnx_models import check, segment


def _concat_bomb(k: int) -> bytes:
    """The review's bomb: k Concat(x, x) over one float, sliced back to 4 values (about 1 KB)."""
    nodes = [helper.make_node("Concat", [f"c{i}", f"c{i}"], [f"c{i + 1}"], axis=0) for i in range(k)]
    nodes += [helper.make_node("Slice", [f"c{k}", "st", "en"], ["s"]),
              helper.make_node("Add", [INPUT_NAME, "s"], [OUTPUT_NAME])]
    inits = [numpy_helper.from_array(np.ones(1, np.float32), "c0"),
             numpy_helper.from_array(np.array([0], np.int64), "st"),
             numpy_helper.from_array(np.array([4], np.int64), "en")]
    return segment(nodes, inits)


def test_a_short_concat_chain_passes():
    assert check(_concat_bomb(4)).ops == {"Concat", "Slice", "Add"}


@pytest.mark.parametrize("k", [25, 40])
def test_the_concat_bomb_is_refused_naming_the_node_and_its_size(k):
    data = _concat_bomb(k)
    assert len(data) < 4096
    with pytest.raises(OversizeError, match=r"node 24 \(Concat -> 'c25'\) makes a tensor of 33554432 "
                                            r"elements per sample, over the cap of 16777216"):
        check(data)


def test_a_bomb_through_the_batch_is_counted_per_sample():
    nodes = [helper.make_node("Concat", [f"c{i}", f"c{i}"], [f"c{i + 1}"], axis=1) for i in range(23)]
    nodes[0].input[:] = [INPUT_NAME, INPUT_NAME]
    nodes.append(helper.make_node("Identity", ["c23"], [OUTPUT_NAME]))
    with pytest.raises(OversizeError, match=r"node 21 .* 16777216 elements per sample"):
        check(segment(nodes, []), OnnxSegmentLimits(max_tensor_elements=(1 << 24) - 1))


REFUSED = {
    "out of topological order": ([helper.make_node("Relu", ["r"], [OUTPUT_NAME]),
                                  helper.make_node("Relu", [INPUT_NAME], ["r"])], [], "topological order"),
    "a value made twice": ([helper.make_node("Relu", [INPUT_NAME], [OUTPUT_NAME]),
                            helper.make_node("Relu", [INPUT_NAME], [OUTPUT_NAME])], [], "again"),
    "the output never made": ([helper.make_node("Relu", [INPUT_NAME], ["r"])], [], "never makes"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_shape_the_check_cannot_determine_is_refused(case):
    nodes, inits, message = REFUSED[case]
    with pytest.raises(UnsafeSegmentError, match=message):
        check(segment(nodes, inits))


def test_an_input_without_a_static_shape_or_another_opset_is_refused():
    relu = [helper.make_node("Relu", [INPUT_NAME], [OUTPUT_NAME])]
    with pytest.raises(UnsafeSegmentError, match="static shape"):
        check(segment(relu, [], input_shape=("N", "C")))
    with pytest.raises(UnsafeSegmentError, match="opset 17, not 18"):
        check(segment(relu, [], opset=17))
