"""The check's static sizes (kernels.onnx_shapes): a graph of allowed operators that would make a
huge tensor is refused before ONNX Runtime folds or runs it; every real segment is accepted."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from qpart.kernels.errors import OversizeError, UnsafeSegmentError
from qpart.kernels.onnx_segment import INPUT_NAME, OUTPUT_NAME, OnnxSegmentLimits
from tests.kernels.onnx_models import check, segment, window_bomb


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


def _many_tensors(copies: int) -> bytes:
    """A Concat chain to one tensor of 2**23 floats, ``copies`` Identity copies of it, sliced back."""
    nodes = [helper.make_node("Concat", [f"c{i}", f"c{i}"], [f"c{i + 1}"], axis=0) for i in range(23)]
    nodes += [helper.make_node("Identity", [f"d{j}" if j else "c23"], [f"d{j + 1}"]) for j in range(copies)]
    nodes += [helper.make_node("Slice", [f"d{copies}", "st", "en"], ["s"]),
              helper.make_node("Add", [INPUT_NAME, "s"], [OUTPUT_NAME])]
    inits = [numpy_helper.from_array(np.ones(1, np.float32), "c0"),
             numpy_helper.from_array(np.array([0], np.int64), "st"),
             numpy_helper.from_array(np.array([4], np.int64), "en")]
    return segment(nodes, inits)


def test_many_tensors_each_under_the_cap_are_refused_by_their_total():
    limits = OnnxSegmentLimits()
    assert limits.max_tensor_elements > 1 << 23 and limits.max_total_elements == 1 << 26
    check(_many_tensors(5))  # 2**24 - 2 in the chain, 5 * 2**23 in the copies, 8 after: 7 * 2**23 + 6
    data = _many_tensors(8)
    assert len(data) < 4096
    with pytest.raises(OversizeError, match=r"^ONNX segment node 29 \(Identity -> 'd7'\) brings its node "
                                            r"outputs to 75497470 elements per sample in all, over the "
                                            r"total cap of 67108864$"):
        check(data)
    check(data, OnnxSegmentLimits(max_total_elements=1 << 27))


def test_the_total_cap_counts_every_node_output_per_sample():
    relus = [helper.make_node("Relu", [f"r{i}" if i else INPUT_NAME], [f"r{i + 1}"]) for i in range(9)]
    relus.append(helper.make_node("Relu", ["r9"], [OUTPUT_NAME]))
    data = segment(relus, [])  # ten tensors of [N, 4]
    check(data, OnnxSegmentLimits(max_total_elements=40))
    with pytest.raises(OversizeError, match=r"node 9 \(Relu -> 'activation'\) .* 40 elements per sample "
                                            r"in all, over the total cap of 39"):
        check(data, OnnxSegmentLimits(max_total_elements=39))


@pytest.mark.parametrize(("op", "cost"), [("AveragePool", "1.76e\\+13"), ("MaxPool", "1.76e\\+13"),
                                        ("Conv", "3.52e\\+13")])
def test_a_huge_window_within_every_memory_cap_is_refused_by_its_work_naming_the_node(op, cost):
    """Issue 52, finding 2: Concats make a tensor at the element cap, then one window as large as
    half of it would run for about an hour per sample; it is refused before anything runs it."""
    data = window_bomb(op=op)
    assert len(data) < 1400
    node = 25 if op == "Conv" else 24
    with pytest.raises(OversizeError, match=rf"^ONNX segment node {node} \({op} -> 'activation'\) costs "
                                            rf"about {cost} operations per sample, bringing the graph to "
                                            rf"{cost}, over the work budget of 6.87e\+10$"):
        check(data)


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


def _indexed(table: np.ndarray, reader: str = "Gather") -> bytes:
    """``input`` [N, 4] plus a float table indexed by ``table`` (a relative-position index)."""
    bias = np.arange(200, dtype=np.float32)
    nodes = ([helper.make_node("Gather", ["bias", "index"], ["b"]),
              helper.make_node("Slice", ["b", "st", "en"], ["s"])] if reader == "Gather" else
             [helper.make_node(reader, ["index", "index"], ["b"]),
              helper.make_node("Cast", ["b"], ["c"], to=1),
              helper.make_node("Slice", ["c", "st", "en"], ["s"])])
    nodes.append(helper.make_node("Add", [INPUT_NAME, "s"], [OUTPUT_NAME]))
    inits = [numpy_helper.from_array(bias, "bias"), numpy_helper.from_array(table, "index"),
             numpy_helper.from_array(np.array([0], np.int64), "st"),
             numpy_helper.from_array(np.array([4], np.int64), "en")]
    return segment(nodes, inits)


def test_an_int64_index_table_read_by_a_gather_passes():
    assert "Gather" in check(_indexed(np.arange(150, dtype=np.int64) % 200)).ops


def test_an_int64_table_read_other_than_as_gather_indices_is_refused():
    with pytest.raises(UnsafeSegmentError, match=r"reads the int64 table 'index' as its input 0: an int64 "
                                                  r"table may only be a Gather's indices"):
        check(_indexed(np.arange(150, dtype=np.int64), reader="Add"))


@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.bool_])
def test_an_initializer_of_another_data_type_than_the_builders_is_refused(dtype):
    with pytest.raises(UnsafeSegmentError, match=r"initializer 'index' has data type \d+; a segment's are "
                                                  r"float32, uint8, int32 or int64"):
        check(_indexed(np.zeros(150, dtype)))
