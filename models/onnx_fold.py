"""Size arithmetic of an exported head, worked out on the server (ADR 0019).

``torch.onnx.export`` writes what the model's Python computes from ``x.shape`` or ``x.size()`` as
nodes (``Shape``, ``Gather``, ``Unsqueeze``, ``Concat``, ``Div``, ``ConstantOfShape``, ...). Every
dimension of a head's tensors is static but the batch, so each such value is known here: it is
computed twice, with two batch sizes, by ONNX's reference implementation of each operator. What
comes out the same both times is a constant. What differs depends on the batch, and a segment can
carry it in two ways only: as a ``Reshape`` target, where the one batch-dependent entry becomes
``-1``; or as a shape that ``Expand`` takes, whose batch entry is the input's own batch,
``Shape(input)[0:1]``. Anything else is refused with :class:`~models.errors.PartitionError`: that cut
is then not offered to the ONNX runtimes, and the artifact says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from qpart.models.errors import PartitionError

BATCHES = (1009, 1013)
"""The two batch sizes the values are worked out for (primes, far from any real dimension)."""

_BATCH_DIM = "N"

MAX_FOLDED_ELEMENTS = 1 << 16
"""The most elements a value worked out here may have. Size arithmetic is a few int64 values, and
an index table made from ``arange`` (a relative-position index) some thousands; a larger value is
an activation made from the input's shape (``torch.zeros_like(x)``, at :data:`BATCHES` gigabytes),
which is left to the graph, never materialized."""


@dataclass
class Folded:
    """Per value name: its value at each of :data:`BATCHES`, for the values the nodes compute from
    sizes and constants alone."""

    values: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    dims: dict[str, list[int | str]] = field(default_factory=dict)
    """Each value's dimensions by ONNX's shape inference (``N``: the batch)."""

    def constant(self, name: str) -> np.ndarray | None:
        """The value if it is the same for both batch sizes (a constant), else None."""
        a, b = self.values[name]
        return a if a.shape == b.shape and np.array_equal(a, b) else None

    def reshape_target(self, name: str, data: str) -> np.ndarray:
        """A ``Reshape`` target with its one batch-dependent entry as ``0`` where it is the batch
        and so is the same dimension of ``data`` (the reshaped value), else as ``-1``."""
        a, b = self.values[name]
        if a.shape != b.shape or a.ndim != 1:
            raise PartitionError("a reshape whose rank depends on the batch size")
        moving = a != b
        at = np.flatnonzero(moving)
        # Where shape inference lost the reshaped value's sizes (a reshape of a reshape), an
        # activation's batch is its first dimension; the ONNX check of every cut (models.runtimes)
        # runs the segment at two batch sizes against the torch head, so a wrong guess is caught.
        source = self.dims.get(data, [_BATCH_DIM])
        if len(at) == 1 and (a[at[0]], b[at[0]]) == BATCHES and at[0] < len(source) \
                and source[at[0]] == _BATCH_DIM and not (a[~moving] == 0).any():
            out = a.copy()
            out[at[0]] = 0  # copies the batch from the reshaped value
            return out
        if int(moving.sum()) != 1 or (a[~moving] == -1).any():
            raise PartitionError(f"a reshape to {_shown(a, b)} has more than one size that depends on "
                                 "the batch")
        out = a.copy()
        out[moving] = -1
        return out

    def batch_shape(self, name: str) -> tuple[np.ndarray, int]:
        """A shape whose one batch-dependent entry is the batch itself: the shape with that entry
        set to 1, and its index."""
        a, b = self.values[name]
        if a.shape != b.shape or a.ndim != 1:
            raise PartitionError("a shape whose rank depends on the batch size")
        moving = np.flatnonzero(a != b)
        if len(moving) != 1 or (a[moving[0]], b[moving[0]]) != BATCHES:
            raise PartitionError(f"a shape {_shown(a, b)} that is not the batch times constants")
        out = a.copy()
        out[moving[0]] = 1
        return out, int(moving[0])


def _shown(a: np.ndarray, b: np.ndarray) -> str:
    return "[" + ", ".join(str(x) if x == y else "N-dependent" for x, y in zip(a.tolist(), b.tolist(),
                                                                             strict=False)) + "]"


def fold_sizes(model: onnx.ModelProto, weights: frozenset[str],
               constants: Mapping[str, np.ndarray]) -> Folded:
    """Work out every value the graph computes from sizes and constants (not from ``input``'s data
    nor from a head tensor in ``weights``), at both :data:`BATCHES`.

    For each batch size, ONNX's shape inference runs on the graph with the input's batch set and
    every value worked out so far given as a constant; the sizes it finds let more ``Shape`` nodes
    be worked out, and so on until nothing more is (a reshape of a reshape needs two rounds).

    Args:
        model: the exported float head.
        weights: the head tensors' names, which stay tensors of the segment.
        constants: every other initializer and Constant node output, by name.
    """
    known = {name: value for name, value in constants.items() if name not in weights}
    runs = [_fold_at(model, batch, known) for batch in BATCHES]
    values = {name: (runs[0][0][name], runs[1][0][name]) for name in runs[0][0] if name in runs[1][0]}
    dims: dict[str, list[int | str]] = {}
    for name, first in runs[0][1].items():
        second = runs[1][1].get(name)
        if second is not None and len(second) == len(first):
            dims[name] = [_BATCH_DIM if (a, b) == BATCHES else a for a, b in zip(first, second, strict=True)]
    return Folded(values, dims)


def _fold_at(model: onnx.ModelProto, batch: int, constants: Mapping[str, np.ndarray]
             ) -> tuple[dict[str, np.ndarray], dict[str, list[int]]]:
    """The values worked out and the sizes found with the input's batch set to ``batch``."""
    values = dict(constants)
    while True:
        dims = _static_dims(_with_values(model, batch, values))
        before = len(values)
        for node in model.graph.node:
            if node.op_type == "Constant" or not node.output or node.output[0] in values:
                continue
            if node.op_type == "Shape" and node.input[0] in dims:
                values[node.output[0]] = _shape_values(node, dims[node.input[0]])
            elif node.input and all(not name or name in values for name in node.input):
                feeds = {name: values[name] for name in node.input if name}
                if not _small(node, feeds):
                    continue
                try:
                    outs = ReferenceEvaluator(node).run(None, feeds)
                except Exception as exc:  # the reference implementation raises many types
                    raise PartitionError(f"the size computation {node.op_type} cannot be worked out: "
                                         f"{exc}") from exc
                values.update({name: np.asarray(out) for name, out in zip(node.output, outs, strict=False)
                               if name and np.size(out) <= MAX_FOLDED_ELEMENTS})
        if len(values) == before:
            return values, dims


def _small(node: onnx.NodeProto, feeds: Mapping[str, np.ndarray]) -> bool:
    """Whether ``node``'s inputs, and its output as far as it can be told before it is computed,
    are at most :data:`MAX_FOLDED_ELEMENTS` elements (each input is, having been worked out)."""
    ins = [feeds[name] for name in node.input if name]
    try:
        if node.op_type == "ConstantOfShape":
            return _count(ins[0]) <= MAX_FOLDED_ELEMENTS
        if node.op_type == "Expand":
            return _count(np.broadcast_shapes(np.shape(ins[0]), tuple(np.asarray(ins[1]).tolist()))) \
                <= MAX_FOLDED_ELEMENTS
        if node.op_type == "Tile":
            return np.size(ins[0]) * _count(ins[1]) <= MAX_FOLDED_ELEMENTS
        if node.op_type == "Range":
            start, limit, delta = (float(np.asarray(v)) for v in ins)
            return delta != 0 and (limit - start) / delta <= MAX_FOLDED_ELEMENTS
        shapes = [np.shape(x) for x in ins]
        return _count(np.broadcast_shapes(*shapes)) <= MAX_FOLDED_ELEMENTS if shapes else True
    except (ValueError, TypeError, IndexError):  # shapes that do not broadcast: the operator's own rule
        return True


def _count(shape: object) -> int:
    """The elements of a tensor of ``shape`` (a sequence of sizes); any negative size counts as
    too many."""
    sizes = [int(d) for d in np.asarray(shape).reshape(-1).tolist()]
    return int(np.prod(sizes, dtype=np.float64)) if all(d >= 0 for d in sizes) else MAX_FOLDED_ELEMENTS + 1


def _with_values(model: onnx.ModelProto, batch: int, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` for shape inference: the batch set, the worked-out values constants."""
    graph = model.graph
    nodes = [n for n in graph.node if not any(o in values for o in n.output)]
    inputs = [helper.make_tensor_value_info(i.name, i.type.tensor_type.elem_type,
                                            [batch, *[d.dim_value for d in i.type.tensor_type.shape.dim[1:]]])
              for i in graph.input]
    inits = [numpy_helper.from_array(np.asarray(v), name) for name, v in values.items()]
    inits += [i for i in graph.initializer if i.name not in values]
    copy = helper.make_model(helper.make_graph(nodes, graph.name, inputs, list(graph.output), inits),
                             opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return copy


def _static_dims(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Each value's dimensions, where ONNX's shape inference finds them all."""
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    dims: dict[str, list[int]] = {}
    for info in [*inferred.graph.input, *inferred.graph.value_info]:
        if not info.type.tensor_type.HasField("shape"):
            continue
        shape = [int(d.dim_value) for d in info.type.tensor_type.shape.dim if d.HasField("dim_value")]
        if len(shape) == len(info.type.tensor_type.shape.dim):
            dims[info.name] = shape
    return dims


def _shape_values(node: onnx.NodeProto, dims: list[int]) -> np.ndarray:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    return np.array(dims[start:] if end is None else dims[start:int(end)], np.int64)


def constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The initializers and the outputs of ``Constant`` nodes, as arrays."""
    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            outs = ReferenceEvaluator(node).run(None, {})
            values[node.output[0]] = np.asarray(next(iter(outs)))
    return values
