"""An ONNX segment's graph as the check read it (ADR 0012): the nodes, their attributes and the
initializers that :mod:`kernels.onnx_walk` hands to the shape check of :mod:`kernels.onnx_shapes`.

Needs neither onnx nor numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

BATCH = -1
"""The symbolic batch dimension in a shape (counted as 1 in a tensor's size)."""

Shape = tuple[int, ...]

# AttributeProto.AttributeType
FLOAT, INT, STRING, FLOATS, INTS = 1, 2, 3, 6, 7
INT64 = 7  # TensorProto.INT64

INITIALIZER_TYPES: dict[int, str] = {
    1: "float32: weights, scales, mins, float buffers",
    2: "uint8: packed codes",
    6: "int32: the byte rows a Gather picks when unpacking codes",
    INT64: "int64: sizes, axes, and integer buffers read as indices",
}
"""The ``TensorProto`` data types a segment's initializers may have, with what each carries."""

SMALL_INT64 = 64
"""The most values of an int64 initializer that is a size or axes; a longer one is an index table,
which only a ``Gather`` may read (as its indices)."""


@dataclass(frozen=True)
class Attribute:
    """One node attribute as the check read it: its declared type and the value of that type."""

    name: str
    type: int
    i: int = 0
    f: float = 0.0
    s: str = ""
    ints: tuple[int, ...] = ()


@dataclass(frozen=True)
class Node:
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: dict[str, Attribute] = field(default_factory=dict)


@dataclass(frozen=True)
class Initializer:
    name: str
    dims: Shape
    data_type: int
    raw: memoryview | None = None
    int64_data: tuple[int, ...] = ()
    tracked: bool = False
    """A value the check worked out (``Shape``, then ``Concat``), not one the segment holds: its
    ``int64_data`` entries equal to :data:`BATCH` stand for the input's batch size."""


def elements(shape: Shape) -> int:
    """A tensor's elements per sample (the batch dimension counted as 1)."""
    return math.prod(d for d in shape if d != BATCH)
