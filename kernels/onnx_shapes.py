"""Static tensor sizes of an ONNX segment's graph, computed before ONNX Runtime sees it (ADR 0012).

The allow-listed operators cannot read files or run subgraphs, but they can still ask for memory: a
chain of ``k`` ``Concat(x, x)`` nodes over a 4-byte initializer is a 1 KB segment that makes ONNX
Runtime allocate ``4 * 2**k`` bytes while it folds constants. So the check propagates every
tensor's shape through the graph, node by node, with each operator's ONNX (opset 18) semantics and
attributes (the rules of :mod:`kernels.onnx_shape_rules`), and refuses a tensor over the cap,
node outputs whose sizes add up to more than the total cap (many tensors each under the first cap),
a node out of topological order, and any shape it cannot determine: it refuses rather than guesses.
On the way it adds up each node's estimated operations (:mod:`kernels.onnx_cost`) and refuses a
graph whose work is over the budget it is given (ADR 0020). The batch dimension of ``input`` is
symbolic (:data:`~kernels.onnx_graph.BATCH`): sizes and work are counted per sample.

Needs neither onnx nor numpy: the walk of :mod:`kernels.onnx_walk` hands over what it read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from qpart.kernels.errors import OversizeError, UnsafeSegmentError, WireFormatError, WorkBudgetError
from qpart.kernels.onnx_cost import node_flops
from qpart.kernels.onnx_graph import (
    BATCH,
    INITIALIZER_TYPES,
    INT64,
    SMALL_INT64,
    Initializer,
    Node,
    Shape,
    elements,
)
from qpart.kernels.onnx_layout_rules import LAYOUT_RULES, split_shapes
from qpart.kernels.onnx_shape_rules import RULES as BASIC_RULES
from qpart.kernels.onnx_shape_rules import Refused, int64_values

RULES = {**BASIC_RULES, **LAYOUT_RULES}


class GraphSize(NamedTuple):
    """What the shape check found of a graph it passed, per sample."""

    largest: int
    """Elements of its largest tensor."""
    flops: int
    """Estimated operations of all its nodes (:func:`~kernels.onnx_cost.node_flops`)."""


def check_shapes(input_name: str, input_dims: Shape, initializers: Sequence[Initializer],
                 nodes: Sequence[Node], output_name: str, *, max_elements: int, max_total: int,
                 max_flops: int | None = None) -> GraphSize:
    """Propagate shapes from ``input`` (``input_dims``, :data:`BATCH` for the symbolic batch) and
    the initializers through ``nodes`` in order; return the largest tensor's size and the
    estimated operations of all the nodes (per sample).

    Raises:
        OversizeError: a tensor of more than ``max_elements`` elements, naming the node; or node
            outputs of more than ``max_total`` elements per sample in all, naming the node that
            brings them over and their total.
        WorkBudgetError: nodes whose estimated operations per sample (:func:`node_flops`) add up to
            more than ``max_flops`` (None: no budget), naming the node that brings them over, its
            own estimate and the total.
        UnsafeSegmentError: a node out of topological order, a value defined twice, a shape the
            check cannot determine, or shapes the operator does not accept.
    """
    shapes: dict[str, Shape] = {input_name: input_dims}
    consts: dict[str, Initializer] = {}
    largest = elements(input_dims)
    for init in initializers:
        if init.name in shapes:
            raise UnsafeSegmentError(f"ONNX segment defines the value {init.name[:40]!a} twice")
        if init.data_type not in INITIALIZER_TYPES:
            raise UnsafeSegmentError(f"ONNX segment initializer {init.name[:40]!a} has data type "
                                     f"{init.data_type}; a segment's are float32, uint8, int32 or int64")
        if any(d < 0 for d in init.dims):
            raise WireFormatError(f"initializer {init.name[:40]!a} has a negative dimension")
        n = elements(init.dims)
        if n > max_elements:
            raise OversizeError(f"ONNX segment initializer {init.name[:40]!a} has {n} elements, over "
                                f"the cap of {max_elements}")
        shapes[init.name], consts[init.name] = init.dims, init
        largest = max(largest, n)
    total = work = 0
    for index, node in enumerate(nodes):
        n, flops = _propagate(index, node, shapes, consts, max_elements)
        largest = max(largest, n)
        total += n * sum(1 for name in node.outputs if name)  # each output is a tensor of its own
        if total > max_total:
            raise OversizeError(f"ONNX segment {_where(index, node)} brings its node outputs to {total} "
                                f"elements per sample in all, over the total cap of {max_total}")
        work += flops
        if max_flops is not None and work > max_flops:
            raise WorkBudgetError(f"ONNX segment {_where(index, node)} costs about {flops:.3g} operations "
                                  f"per sample, bringing the graph to {work:.3g}, over the work budget "
                                  f"of {max_flops:.3g}")
    if output_name not in shapes:
        raise UnsafeSegmentError(f"ONNX segment never makes its output {output_name!r}")
    return GraphSize(largest, work)


def _where(index: int, node: Node) -> str:
    return f"node {index} ({node.op} -> {node.outputs[0][:40] if node.outputs else '?'!a})"


def _propagate(index: int, node: Node, shapes: dict[str, Shape], consts: dict[str, Initializer],
               max_elements: int) -> tuple[int, int]:
    """One node's output shapes into ``shapes`` (and, for ``Shape`` and a ``Concat`` of such
    values, the value into ``consts`` as a tracked one); the size of its largest output and the
    node's estimated operations per sample."""
    where = _where(index, node)
    missing = next((name for name in node.inputs if name and name not in shapes), None)
    if missing is not None:
        raise UnsafeSegmentError(f"ONNX segment {where} reads {missing[:40]!a} before any node makes it "
                                 "(the graph is not in topological order)")
    several = (node.op == "MaxPool" and len(node.outputs) == 2) or (node.op == "Split" and node.outputs)
    if len(node.outputs) != 1 and not several:
        raise UnsafeSegmentError(f"ONNX segment {where} has {len(node.outputs)} outputs, not 1")
    _check_index_tables(where, node, consts)
    ins = [shapes[name] if name else None for name in node.inputs]
    try:
        outs = split_shapes(ins, node, consts) if node.op == "Split" else \
            [RULES[node.op](ins, node, consts)] * len(node.outputs)
        value = _tracked(node, ins, consts)
    except Refused as exc:
        raise UnsafeSegmentError(f"ONNX segment {where}: {exc}") from None
    largest = 0
    for name, out in zip(node.outputs, outs, strict=True):
        if out.count(BATCH) > 1:  # per-sample counts would miss N**k elements
            raise UnsafeSegmentError(f"ONNX segment {where} puts the batch in more than one axis")
        n = elements(out)
        if n > max_elements:
            raise OversizeError(f"ONNX segment {where} makes a tensor of {n} elements per sample, over "
                                f"the cap of {max_elements}")
        largest = max(largest, n)
        if not name:
            continue
        if name in shapes:
            raise UnsafeSegmentError(f"ONNX segment {where} defines {name[:40]!a} again")
        shapes[name] = out
    if value is not None:
        name = node.outputs[0]
        consts[name] = Initializer(name, (len(value),), INT64, None, value, tracked=True)
    return largest, node_flops(node, ins, outs)


def _check_index_tables(where: str, node: Node, consts: dict[str, Initializer]) -> None:
    """Refuse an int64 initializer longer than a size read other than as a ``Gather``'s indices."""
    for at, name in enumerate(node.inputs):
        init = consts.get(name) if name else None
        if init is not None and init.data_type == INT64 and not init.tracked \
                and elements(init.dims) > SMALL_INT64 and not (node.op == "Gather" and at == 1):
            raise UnsafeSegmentError(f"ONNX segment {where} reads the int64 table {name[:40]!a} as its "
                                     f"input {at}: an int64 table may only be a Gather's indices")


def _tracked(node: Node, ins: list[Shape | None], consts: dict[str, Initializer]) -> tuple[int, ...] | None:
    """The value of a ``Shape`` node (its input's sizes, the batch as :data:`BATCH`), or of a
    ``Concat`` of such values and small int64 initializers; None for any other node."""
    if node.op == "Shape":
        x = ins[0]
        assert x is not None
        (length,) = RULES["Shape"](ins, node, consts)
        start = node.attributes["start"].i if "start" in node.attributes else 0
        start = max(0, min(len(x), start + len(x) if start < 0 else start))
        return x[start : start + length]
    if node.op != "Concat" or not any(consts.get(n) is not None and consts[n].tracked for n in node.inputs):
        return None
    joined: list[int] = []
    for name in node.inputs:
        init = consts.get(name)
        if init is None or init.data_type != INT64 or len(init.dims) != 1:
            return None
        joined += int64_values(consts, name, "input", tracked=True)
    return tuple(joined)
