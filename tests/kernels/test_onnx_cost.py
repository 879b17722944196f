"""The work estimate of the check (kernels.onnx_cost, issue 52 finding 2): each node's operations per
sample as the model card counts FLOPs, added up and held to the budget the check is given."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from qpart.kernels.errors import OversizeError, WorkBudgetError
from qpart.kernels.onnx_segment import INPUT_NAME, OUTPUT_NAME, OnnxSegmentLimits
from tests.kernels.onnx_models import check, segment, window_bomb


def _weights(name: str, *shape: int) -> object:
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


CASES = {
    # [N, 3, 8, 8] * [4, 3, 3, 3] -> [N, 4, 6, 6]: 144 outputs, each 27 multiply-adds
    "Conv": ([helper.make_node("Conv", [INPUT_NAME, "w"], [OUTPUT_NAME])], [_weights("w", 4, 3, 3, 3)],
             ("N", 3, 8, 8), 2 * 144 * 27),
    # a depthwise one: each output reads its own channel only
    "Conv, 4 groups": ([helper.make_node("Conv", [INPUT_NAME, "w"], [OUTPUT_NAME], group=4)],
                       [_weights("w", 4, 1, 3, 3)], ("N", 4, 8, 8), 2 * 144 * 9),
    # [N, 5, 6] @ [6, 7] -> [N, 5, 7]: 35 outputs of 6 multiply-adds
    "MatMul": ([helper.make_node("MatMul", [INPUT_NAME, "w"], [OUTPUT_NAME])], [_weights("w", 6, 7)],
               ("N", 5, 6), 2 * 35 * 6),
    # [N, 6] x [7, 6]^T + [7]: 7 outputs of 6 multiply-adds, and the bias
    "Gemm": ([helper.make_node("Gemm", [INPUT_NAME, "w", "b"], [OUTPUT_NAME], transB=1)],
             [_weights("w", 7, 6), _weights("b", 7)], ("N", 6), 2 * 7 * 6 + 7),
    # [N, 2, 9, 9], 3 x 3 windows at stride 2 -> [N, 2, 4, 4]: 32 outputs of 9 reads
    "MaxPool": ([helper.make_node("MaxPool", [INPUT_NAME], [OUTPUT_NAME], kernel_shape=[3, 3],
                                  strides=[2, 2])], [], ("N", 2, 9, 9), 32 * 9),
    "GlobalAveragePool": ([helper.make_node("GlobalAveragePool", [INPUT_NAME], [OUTPUT_NAME])], [],
                          ("N", 2, 9, 9), 162),
    "Softmax": ([helper.make_node("Softmax", [INPUT_NAME], [OUTPUT_NAME], axis=-1)], [], ("N", 10), 4 * 10),
    # the broadcast output, not the smaller input
    "Add": ([helper.make_node("Add", [INPUT_NAME, "w"], [OUTPUT_NAME])], [_weights("w", 3, 1)],
            ("N", 1, 4), 12),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_node_costs_its_operations_per_sample_as_a_model_card_counts_flops(case):
    nodes, inits, shape, flops = CASES[case]
    assert check(segment(nodes, inits, shape)).flops == flops


def test_the_graphs_work_is_the_sum_of_its_nodes_and_a_budget_of_exactly_it_passes():
    # [N, 1, 1, 1] doubled 3 times on each spatial axis (2 + 4 + 8, then 16 + 32 + 64 elements
    # written), then 4 x 4 windows over [N, 1, 8, 8]: 25 outputs of 16 reads
    data = window_bomb(doublings=3, window=4)
    work = 14 + 112 + 25 * 16
    assert check(data, OnnxSegmentLimits(max_flops=work)).flops == work
    with pytest.raises(WorkBudgetError, match=r"^ONNX segment node 6 \(AveragePool -> 'activation'\) costs "
                                              r"about 400 operations per sample, bringing the graph to "
                                              r"526, over the work budget of 525$"):
        check(data, OnnxSegmentLimits(max_flops=work - 1))


def test_the_node_that_brings_the_work_over_is_named_even_when_it_is_cheap():
    data = window_bomb(doublings=3, window=4)
    with pytest.raises(WorkBudgetError, match=r"node 2 \(Concat -> 'x3_2'\) costs about 8 operations "
                                              r"per sample, bringing the graph to 14, over the work "
                                              r"budget of 13"):
        check(data, OnnxSegmentLimits(max_flops=13))


def test_a_work_refusal_is_an_oversize_refusal_to_callers_that_know_only_that():
    with pytest.raises(OversizeError):
        check(window_bomb(doublings=3, window=4), OnnxSegmentLimits(max_flops=1))

