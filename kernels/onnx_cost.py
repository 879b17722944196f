"""The work an ONNX segment's nodes ask for, estimated from the static shapes before ONNX Runtime
sees them (ADR 0020, issue 52): :func:`kernels.onnx_shapes.check_shapes` adds it up node by node
and refuses a graph over its budget.

The element caps bound memory, not work: a few ``Concat`` nodes make a tensor under the cap, and one
``AveragePool`` with a window as large as that tensor then does ``outputs x window`` additions, an
hour per sample from a 1 KB segment. So each node is given the operations it performs per sample,
counted as the model card counts its FLOPs (``models.partition.cut_flops``: 2 per multiply-add):

- ``Conv``: 2 x outputs x (input channels / group) x kernel area;
- ``MatMul``: 2 x outputs x the contracted size; ``Gemm``: the same, plus one per output for C;
- ``MaxPool``, ``AveragePool``: outputs x window area;
- every other allow-listed operator: one pass over its largest input or output, the most any of
  them does per element (``Softmax`` and ``LayerNormalization`` a few passes: counted 4 and 8).

Constant subgraphs (the dequantization of packed weights) are counted as if they ran per sample,
though ONNX Runtime folds them once at session creation: that work happens on the device too, and
an estimate that only overcounts cannot be gamed. Needs neither onnx nor numpy.
"""

from __future__ import annotations

import math

from qpart.kernels.onnx_graph import Node, Shape, elements

_PASSES = {"Softmax": 4, "LayerNormalization": 8}
"""Passes over the data of operators that read it more than once (max, exp, sum, divide; mean,
variance, normalize, scale and shift)."""


def node_flops(node: Node, ins: list[Shape | None], outs: list[Shape]) -> int:
    """The operations ``node`` performs per sample (the batch counted as 1), from the shapes of its
    inputs (``None``: an omitted optional one) and outputs, which the shape rules have checked."""
    out = max((elements(s) for s in outs), default=0)
    if node.op == "Conv":
        w = ins[1]
        assert w is not None, "checked by the Conv rule"
        return 2 * out * math.prod(w[1:])  # [M, C/group, k...]: each output reads C/group x kernel
    if node.op == "MatMul":
        a = ins[0]
        assert a is not None, "checked by the MatMul rule"
        return 2 * out * a[-1]
    if node.op == "Gemm":
        a = ins[0]
        assert a is not None, "checked by the Gemm rule"
        trans = node.attributes.get("transA")
        k = a[0] if trans is not None and trans.i else a[-1]
        return 2 * out * k + out
    if node.op in ("MaxPool", "AveragePool"):
        kernel = node.attributes.get("kernel_shape")
        assert kernel is not None, "checked by the pooling rule"
        return out * math.prod(kernel.ints)
    largest = max(out, *(elements(s) for s in ins if s is not None))
    return _PASSES.get(node.op, 1) * largest
