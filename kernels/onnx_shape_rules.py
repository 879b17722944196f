"""Each allow-listed operator's attributes and output shape, with ONNX's (opset 18) semantics
(ADR 0012): the rules :func:`kernels.onnx_shapes.check_shapes` applies node by node.

A rule takes the shapes of a node's inputs (``None`` for an omitted optional one), the node and the
graph's initializers, and returns the output's shape, or raises :class:`Refused` for a shape it
cannot determine or the operator would not accept: it refuses rather than guesses. The only values
read are those of small int64 initializers that give a ``Reshape``'s shape or a ``Slice``'s starts,
ends, axes and steps.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence

from qpart.kernels.errors import UnsafeSegmentError, WireFormatError
from qpart.kernels.onnx_graph import (
    BATCH,
    FLOAT,
    INT,
    INT64,
    INTS,
    STRING,
    Attribute,
    Initializer,
    Node,
    Shape,
    elements,
)

_SMALL = 64  # the most values of an int64 initializer the check decodes

_NONE: dict[str, int] = {}
_POOL = {"auto_pad": STRING, "ceil_mode": INT, "kernel_shape": INTS, "pads": INTS, "strides": INTS}
ATTRIBUTES: dict[str, dict[str, int]] = {
    "Add": _NONE, "Mul": _NONE, "BitwiseAnd": _NONE, "Relu": _NONE, "Floor": _NONE, "Identity": _NONE,
    "MatMul": _NONE, "GlobalAveragePool": _NONE, "Slice": _NONE, "Clip": _NONE,
    "Sub": _NONE, "Div": _NONE, "Pow": _NONE, "Sigmoid": _NONE, "HardSwish": _NONE, "Erf": _NONE,
    "Tanh": _NONE, "Sqrt": _NONE, "Exp": _NONE, "Neg": _NONE, "Abs": _NONE, "Reciprocal": _NONE,
    "Softplus": _NONE, "Squeeze": _NONE, "Unsqueeze": _NONE, "Expand": _NONE,
    "HardSigmoid": {"alpha": FLOAT, "beta": FLOAT}, "LeakyRelu": {"alpha": FLOAT}, "Elu": {"alpha": FLOAT},
    "Softmax": {"axis": INT},
    "Transpose": {"perm": INTS}, "Shape": {"start": INT, "end": INT},
    **{op: {"keepdims": INT, "noop_with_empty_axes": INT} for op in ("ReduceMean", "ReduceSum", "ReduceMax")},
    "Split": {"axis": INT, "num_outputs": INT},
    "LayerNormalization": {"axis": INT, "epsilon": FLOAT, "stash_type": INT},
    "Mod": {"fmod": INT}, "BitShift": {"direction": STRING}, "Cast": {"to": INT},
    "Concat": {"axis": INT}, "Flatten": {"axis": INT}, "Gather": {"axis": INT},
    "Reshape": {"allowzero": INT},
    "Conv": {"auto_pad": STRING, "dilations": INTS, "group": INT, "kernel_shape": INTS, "pads": INTS,
             "strides": INTS},
    "MaxPool": {**_POOL, "dilations": INTS, "storage_order": INT},
    "AveragePool": {**_POOL, "count_include_pad": INT},
    "BatchNormalization": {"epsilon": FLOAT, "momentum": FLOAT, "training_mode": INT},
    "Gemm": {"alpha": FLOAT, "beta": FLOAT, "transA": INT, "transB": INT},
}
"""The attributes (name: type) each allow-listed operator has in opset 18; any other is refused."""


def check_attributes(op: str, attributes: dict[str, Attribute]) -> None:
    """Refuse an attribute ``op`` does not have in opset 18, or one of another type."""
    schema = ATTRIBUTES.get(op, _NONE)
    for name, attr in attributes.items():
        if name not in schema:
            raise UnsafeSegmentError(f"ONNX segment gives {op} the attribute {name[:40]!a}, which "
                                     "it does not have")
        if attr.type != schema[name]:
            raise WireFormatError(f"{op} attribute {name} has type {attr.type}, not {schema[name]}")


class Refused(Exception):
    """A shape the check cannot determine or the operator would not accept (the message says)."""


def _arity(ins: list[Shape | None], low: int, high: int, required: int | None = None) -> list[Shape | None]:
    if not low <= len(ins) <= high:
        raise Refused(f"takes {low}..{high} inputs, not {len(ins)}")
    if any(s is None for s in ins[: low if required is None else required]):
        raise Refused("a required input is empty")
    return ins


def _given(ins: list[Shape | None], low: int, high: int | None = None) -> list[Shape]:
    """The shapes of the inputs, all required."""
    found = [s for s in _arity(ins, low, low if high is None else high) if s is not None]
    if len(found) != len(ins):
        raise Refused("an input is empty")
    return found


def _int(node: Node, name: str, default: int | None = None) -> int:
    attr = node.attributes.get(name)
    if attr is None:
        if default is None:
            raise Refused(f"lacks the attribute {name}")
        return default
    return attr.i


def _ints(node: Node, name: str, default: Sequence[int] | None = None) -> tuple[int, ...]:
    attr = node.attributes.get(name)
    if attr is None:
        if default is None:
            raise Refused(f"lacks the attribute {name}")
        return tuple(default)
    return attr.ints


def _axis(axis: int, rank: int, *, inclusive: bool = False) -> int:
    if not -rank <= axis < rank + inclusive:
        raise Refused(f"axis {axis} is outside rank {rank}")
    return axis + rank if axis < 0 else axis


def _same(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    return _given(ins, 1)[0]


def _clip(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    """Clip(x, min?, max?): the bounds, where given, are scalars."""
    x, *bounds = _arity(ins, 1, 3, required=1)
    if any(b is not None and b != () for b in bounds):
        raise Refused(f"bounds of shapes {[_shown(b) for b in bounds if b is not None]} are not scalars")
    assert x is not None, "required by _arity"
    return x


def _broadcast(shapes: Sequence[Shape]) -> Shape:
    rank = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[(1,) * (rank - len(s)) + s for s in shapes], strict=True):
        wide = {d for d in dims if d != 1}
        if len(wide) > 1:
            raise Refused(f"cannot broadcast {' and '.join(map(_shown, shapes))}")
        out.append(wide.pop() if wide else 1)
    return tuple(out)


def _elementwise(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    return _broadcast(_given(ins, 2))


def _matmul(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    a, b = _given(ins, 2)
    if not a or not b:
        raise Refused("a scalar operand")
    a2, b2 = (1, *a) if len(a) == 1 else a, (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2] or a2[-1] == BATCH:
        raise Refused(f"cannot multiply {_shown(a)} by {_shown(b)}")
    out = (*_broadcast([a2[:-2], b2[:-2]]), a2[-2], b2[-1])
    return _drop_vector_axes(out, len(a) == 1, len(b) == 1)


def _drop_vector_axes(out: Shape, a_vector: bool, b_vector: bool) -> Shape:
    dims = list(out)
    if b_vector:
        del dims[-1]
    if a_vector:
        del dims[-1 if b_vector else -2]
    return tuple(dims)


def _gemm(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    _arity(ins, 2, 3)
    a, b = ins[0], ins[1]
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        raise Refused("A and B must be matrices")
    m, k = a[::-1] if _int(node, "transA", 0) else a
    k2, n = b[::-1] if _int(node, "transB", 0) else b
    if k != k2 or k == BATCH:
        raise Refused(f"cannot multiply {_shown(a)} by {_shown(b)}")
    c = ins[2] if len(ins) == 3 else None
    if c is not None and _broadcast([c, (m, n)]) != (m, n):
        raise Refused(f"C {_shown(c)} does not broadcast to {_shown((m, n))}")
    return m, n


def _spatial(x: Shape, what: str) -> tuple[int, int, Shape]:
    if len(x) < 3 or BATCH in x[1:]:
        raise Refused(f"{what} takes [N, C, spatial...], not {_shown(x)}")
    return x[0], x[1], x[2:]


def _window(node: Node, spatial: Shape, kernel: Shape, *, ceil: bool) -> Shape:
    rank = len(spatial)
    auto_pad = node.attributes.get("auto_pad")
    if auto_pad is not None and auto_pad.s != "NOTSET":
        raise Refused(f"auto_pad {auto_pad.s[:20]!a} is not supported")
    strides, dilations = _ints(node, "strides", (1,) * rank), _ints(node, "dilations", (1,) * rank)
    pads = _ints(node, "pads", (0,) * 2 * rank)
    if len(kernel) != rank or len(strides) != rank or len(dilations) != rank or len(pads) != 2 * rank:
        raise Refused(f"kernel, strides, dilations or pads do not match {rank} spatial dimensions")
    if min(kernel, default=1) < 1 or min(strides) < 1 or min(dilations) < 1 or min(pads, default=0) < 0:
        raise Refused("a kernel, stride, dilation or pad below its minimum")
    out = []
    for i, size in enumerate(spatial):
        span = size + pads[i] + pads[rank + i] - dilations[i] * (kernel[i] - 1) - 1
        if span < 0:
            raise Refused(f"the window is larger than the padded input {_shown(spatial)}")
        length = -(-span // strides[i]) + 1 if ceil else span // strides[i] + 1
        if ceil and (length - 1) * strides[i] >= size + pads[i]:  # the last window starts in the pad
            length -= 1
        out.append(length)
    return tuple(out)


def _conv(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    _arity(ins, 2, 3)
    x, w, b = ins[0], ins[1], ins[2] if len(ins) == 3 else None
    assert x is not None and w is not None
    n, c, spatial = _spatial(x, "Conv")
    group = _int(node, "group", 1)
    if len(w) != len(x) or BATCH in w or group < 1 or w[0] % group or w[1] * group != c:
        raise Refused(f"weight {_shown(w)} (group {group}) does not fit input {_shown(x)}")
    kernel = _ints(node, "kernel_shape", w[2:])
    if kernel != w[2:]:
        raise Refused(f"kernel_shape {list(kernel)} is not the weight's {list(w[2:])}")
    if b is not None and b != (w[0],):
        raise Refused(f"bias {_shown(b)} does not fit {w[0]} output channels")
    return n, w[0], *_window(node, spatial, kernel, ceil=False)


def _pool(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    (x,) = _given(ins, 1)
    n, c, spatial = _spatial(x, node.op)
    return n, c, *_window(node, spatial, _ints(node, "kernel_shape"), ceil=bool(_int(node, "ceil_mode", 0)))


def _global_pool(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    (x,) = _given(ins, 1)
    n, c, spatial = _spatial(x, "GlobalAveragePool")
    return n, c, *(1,) * len(spatial)


def _batch_norm(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    x, *stats = _given(ins, 5)
    if len(x) < 2 or x[1] == BATCH or any(s != (x[1],) for s in stats) or _int(node, "training_mode", 0):
        raise Refused(f"statistics {', '.join(map(_shown, stats))} do not fit {_shown(x)} (or training)")
    return x


def _flatten(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    (x,) = _given(ins, 1)
    axis = _axis(_int(node, "axis", 1), len(x), inclusive=True)
    return _merged(x[:axis]), _merged(x[axis:])


def _merged(dims: Shape) -> int:
    """The product of ``dims`` as one dimension: the batch only if every other dimension is 1."""
    if BATCH in dims:
        if elements(dims) != 1 or dims.count(BATCH) > 1:
            raise Refused(f"merges the batch dimension with others ({_shown(dims)})")
        return BATCH
    return math.prod(dims)


def _concat(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    shapes = _given(ins, 1, 1 << 16)
    axis = _axis(_int(node, "axis"), len(shapes[0]))
    rest = {s[:axis] + s[axis + 1 :] for s in shapes}
    if len(rest) > 1 or any(len(s) != len(shapes[0]) or s[axis] == BATCH for s in shapes):
        raise Refused(f"cannot join {' and '.join(map(_shown, shapes))} on axis {axis}")
    first = shapes[0]
    return (*first[:axis], sum(s[axis] for s in shapes), *first[axis + 1 :])


def _gather(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    data, indices = _given(ins, 2)
    axis = _axis(_int(node, "axis", 0), len(data))
    if data[axis] == BATCH or (BATCH in indices and BATCH in data):
        raise Refused(f"gathers {_shown(indices)} along the batch of {_shown(data)}")
    return (*data[:axis], *indices, *data[axis + 1 :])


def int64_values(consts: dict[str, Initializer], name: str, what: str, *,
                 tracked: bool = False) -> tuple[int, ...]:
    """The values of a small 1-D int64 initializer (or, where ``tracked``, of a value the check
    worked out, whose :data:`BATCH` entries are the batch)."""
    init = consts.get(name)
    if init is not None and init.tracked and not tracked:
        raise Refused(f"its {what} is computed in the graph, not an initializer")
    if init is None or init.data_type != INT64 or len(init.dims) != 1 or init.dims[0] > _SMALL:
        raise Refused(f"its {what} is not a 1-D int64 initializer of at most {_SMALL} values")
    count = init.dims[0]
    if init.raw is not None:
        if init.int64_data or len(init.raw) != 8 * count:
            raise Refused(f"its {what} has {len(init.raw)} bytes for {count} values")
        return struct.unpack(f"<{count}q", init.raw)
    if len(init.int64_data) != count:
        raise Refused(f"its {what} has {len(init.int64_data)} values for {count}")
    return init.int64_data


def _reshape(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    x, _ = _given(ins, 2)
    target = int64_values(consts, node.inputs[1], "shape")
    allowzero = _int(node, "allowzero", 0)
    out, unknown = [], None
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if i >= len(x):
                raise Refused(f"shape {list(target)} copies dimension {i} of {_shown(x)}")
            out.append(x[i])
        elif d == -1 and unknown is None:
            unknown = i
            out.append(1)
        elif d < 0 or (d == 0 and -1 in target):
            raise Refused(f"shape {list(target)} is not a valid Reshape shape")
        else:
            out.append(d)
    batched = BATCH in x
    if unknown is not None:
        out[unknown] = _unknown_size(x, target, out, unknown)
    if elements(tuple(out)) != elements(x) or batched != (BATCH in out) or out.count(BATCH) > 1:
        raise Refused(f"cannot reshape {_shown(x)} to {list(target)}")
    return tuple(out)


def _unknown_size(x: Shape, target: tuple[int, ...], out: list[int], unknown: int) -> int:
    """The size a Reshape's ``-1`` (at ``unknown`` of ``target``) takes: the batch where the rest is
    one sample's size, else a size per sample; a batch merged into another axis is refused."""
    batched, known = BATCH in x, elements(tuple(out))
    if batched and BATCH not in out and known == elements(x):
        return BATCH  # [N, ...] to [-1, ...] of the same size per sample
    if batched and BATCH not in out and known and elements(x) % known == 0:
        raise Refused(f"Reshape {_shown(x)} to {list(target)} merges the batch into another axis "
                      f"(axis {unknown} would be N x {elements(x) // known}), which ONNX devices "
                      "cannot take: the check counts each tensor per sample (as in MobileViT's "
                      "unfold or Swin's windows)")
    if known == 0 or elements(x) % known or batched != (BATCH in out):
        raise Refused(f"cannot infer the -1 of shape {list(target)} from {_shown(x)}")
    return elements(x) // known


def _slice(ins: list[Shape | None], node: Node, consts: dict[str, Initializer]) -> Shape:
    _arity(ins, 3, 5, required=3)
    x = ins[0]
    assert x is not None
    starts = int64_values(consts, node.inputs[1], "starts")
    ends = int64_values(consts, node.inputs[2], "ends")
    axes = int64_values(consts, node.inputs[3], "axes") if len(ins) > 3 and ins[3] is not None \
        else tuple(range(len(starts)))
    steps = int64_values(consts, node.inputs[4], "steps") if len(ins) > 4 and ins[4] is not None \
        else (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise Refused("starts, ends, axes and steps differ in length")
    out = list(x)
    seen: set[int] = set()
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        a = _axis(axis, len(x))
        if a in seen or step == 0:
            raise Refused("an axis twice or a step of 0")
        seen.add(a)
        dim = x[a]
        if dim == BATCH:
            if (start, step) != (0, 1) or end < (1 << 62):
                raise Refused("slices the batch dimension")
            continue
        out[a] = _slice_length(dim, start, end, step)
    return tuple(out)


def _slice_length(dim: int, start: int, end: int, step: int) -> int:
    """ONNX's Slice on one axis: negative indices from the end, clamped, then counted by step."""
    first, last = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        first, last = min(max(first, 0), dim), min(max(last, 0), dim)
    else:
        first, last = min(max(first, 0), dim - 1), min(max(last, -1), dim - 1)
    return max(0, -(-(last - first) // step))


_Rule = Callable[[list[Shape | None], Node, dict[str, Initializer]], Shape]
RULES: dict[str, _Rule] = {
    "Add": _elementwise, "Mul": _elementwise, "Mod": _elementwise, "BitShift": _elementwise,
    "BitwiseAnd": _elementwise, "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv, "MaxPool": _pool,
    "AveragePool": _pool, "GlobalAveragePool": _global_pool, "BatchNormalization": _batch_norm,
    "Flatten": _flatten, "Concat": _concat, "Gather": _gather, "Reshape": _reshape, "Slice": _slice,
    "Relu": _same, "Floor": _same, "Identity": _same, "Cast": _same, "Clip": _clip,
    "Sub": _elementwise, "Div": _elementwise, "Pow": _elementwise,
    **{op: _same for op in ("Sigmoid", "HardSigmoid", "HardSwish", "Erf", "Tanh", "Sqrt", "Exp", "Neg",
                             "Abs", "Reciprocal", "Softplus", "LeakyRelu", "Elu")},
}


def _shown(shape: Shape) -> str:
    return "[" + ", ".join("N" if d == BATCH else str(d) for d in shape) + "]"
