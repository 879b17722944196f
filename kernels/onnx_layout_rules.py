"""The rules of :mod:`kernels.onnx_shape_rules` for the layout, normalization and attention
operators that ``torch.onnx.export`` writes for modern heads (ADR 0019): ``Softmax``,
``Transpose``, ``LayerNormalization``, ``Squeeze``, ``Unsqueeze``, ``Expand``, ``Shape`` and
``Split`` (whose several outputs :func:`split_shapes` gives). Same contract: the output's shape, or
:class:`~kernels.onnx_shape_rules.Refused`.
"""

from __future__ import annotations

from qpart.kernels.onnx_graph import BATCH, Initializer, Node, Shape
from qpart.kernels.onnx_shape_rules import (
    Refused,
    _arity,
    _axis,
    _broadcast,
    _given,
    _int,
    _ints,
    _Rule,
    _shown,
    int64_values,
)


def _softmax(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    (x,) = _given(ins, 1)
    _axis(_int(node, "axis", -1), len(x))
    return x


def _transpose(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    (x,) = _given(ins, 1)
    perm = _ints(node, "perm", tuple(reversed(range(len(x)))))
    if sorted(perm) != list(range(len(x))):
        raise Refused(f"perm {list(perm)} is not a permutation of {len(x)} axes")
    return tuple(x[p] for p in perm)


def _layer_norm(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    x, scale, *bias = _arity(ins, 2, 3)
    assert x is not None and scale is not None
    axis = _axis(_int(node, "axis", -1), len(x))
    normalized = x[axis:]
    fitted = [_broadcast([b, normalized]) for b in [scale, *bias] if b is not None]
    if BATCH in normalized or any(f != normalized for f in fitted):
        raise Refused(f"scale or bias does not fit the normalized axes {_shown(normalized)}")
    return x


def _axes(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> tuple[int, ...]:
    if len(ins) < 2 or ins[1] is None:
        return ()
    return int64_values(consts, node.inputs[1], "axes")


def _squeeze(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    x = _arity(ins, 1, 2)[0]
    assert x is not None
    given = _axes(ins, node, consts)
    if not given and BATCH in x:  # ONNX Runtime would squeeze a batch of 1 too
        raise Refused("squeezes without axes a tensor with a batch")
    axes = {_axis(a, len(x)) for a in given} or {i for i, d in enumerate(x) if d == 1}
    if any(x[a] != 1 for a in axes):
        raise Refused(f"squeezes an axis of {_shown(x)} that is not 1")
    return tuple(d for i, d in enumerate(x) if i not in axes)


def _unsqueeze(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    x, _ = _given(ins, 2)
    axes = _axes(ins, node, consts)
    rank = len(x) + len(axes)
    placed = {_axis(a, rank) for a in axes}
    if len(placed) != len(axes):
        raise Refused("an axis twice")
    rest = iter(x)
    return tuple(1 if i in placed else next(rest) for i in range(rank))


def _expand(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    x, _ = _given(ins, 2)
    target = int64_values(consts, node.inputs[1], "shape", tracked=True)
    batch = BATCH if consts[node.inputs[1]].tracked else None  # -1 is the batch only where computed
    if any(d < 1 and d != batch for d in target):
        raise Refused(f"shape {list(target)} has a size below 1")
    return _broadcast([x, tuple(target)])


def _shape(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    (x,) = _given(ins, 1)
    start, end = _int(node, "start", 0), _int(node, "end", len(x))
    start, end = (max(0, min(len(x), v + len(x) if v < 0 else v)) for v in (start, end))
    return (max(0, end - start),)


def split_shapes(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> list[Shape]:
    """Split's outputs: equal parts (``num_outputs``) or the sizes of its ``split`` input."""
    x = _arity(ins, 1, 2)[0]
    assert x is not None
    axis = _axis(_int(node, "axis", 0), len(x))
    if x[axis] == BATCH:
        raise Refused("splits the batch dimension")
    if len(ins) == 2 and ins[1] is not None:
        sizes = int64_values(consts, node.inputs[1], "split")
    else:
        parts = _int(node, "num_outputs")
        if parts < 1:
            raise Refused(f"num_outputs {parts}")
        step = -(-x[axis] // parts)
        sizes = tuple(min(step, max(0, x[axis] - step * i)) for i in range(parts))
    if len(sizes) != len(node.outputs) or sum(sizes) != x[axis] or min(sizes, default=0) < 0:
        raise Refused(f"split {list(sizes)} does not divide axis {axis} of {_shown(x)} into "
                      f"{len(node.outputs)} outputs")
    return [(*x[:axis], size, *x[axis + 1 :]) for size in sizes]



def _reduce(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    """ReduceMean, ReduceSum, ReduceMax (opset 18: the axes an input); never over the batch."""
    x = _arity(ins, 1, 2)[0]
    assert x is not None
    given = _axes(ins, node, consts)
    if not given and _int(node, "noop_with_empty_axes", 0):
        return x
    axes = {_axis(a, len(x)) for a in given} or set(range(len(x)))
    if any(x[a] == BATCH for a in axes):
        raise Refused(f"reduces the batch dimension of {_shown(x)}")
    keep = _int(node, "keepdims", 1)
    return tuple(1 if i in axes else d for i, d in enumerate(x) if keep or i not in axes)


LAYOUT_RULES: dict[str, _Rule] = {
    "ReduceMean": _reduce, "ReduceSum": _reduce, "ReduceMax": _reduce,
    "Softmax": _softmax, "Transpose": _transpose, "LayerNormalization": _layer_norm, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Expand": _expand, "Shape": _shape,
}
"""Every operator of this module but ``Split``, which :func:`split_shapes` serves."""
