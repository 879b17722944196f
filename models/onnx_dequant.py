"""In-graph unpacking and dequantization of a packed b-bit tensor, as ONNX nodes (ADR 0012).

The segment carries the packed codes, scales and mins of :mod:`kernels.packing` and
:mod:`kernels.quantization` byte for byte; these nodes turn them into the float32 weight. Every
input is an initializer, so ONNX Runtime folds the whole subgraph once, at session creation.

Per part of ``k`` blocks of ``M`` columns (the full blocks, then the last one), with the part's
bytes stored as a ``[k, b, M]`` uint8 initializer, code row ``r`` (of 8) is::

    t, o = divmod(r * b, 8)
    code = (byte[t] >> o) & (2**b - 1)                                  # b = 1, 2, 4: uint8
    code = floor(byte[t] * 2**-o + byte[t + 1] * 2**(8 - o)) mod 2**b   # b = 3, 5, 6, 7: float32

with one ``Gather`` for all eight rows at once (and, for the second form, one float32 ``MatMul``
that joins the two bytes, exactly: at most 23 significant bits), so a tensor is eight to eleven
nodes whatever its size: a small head's graph must stay within 5% of its safetensors segment.
Then ``x = code * scale + min`` per group, in float32 (two rounded operations, as in
:func:`kernels.quantization.dequantize_numpy`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qpart.kernels import PackedTensor, packed_size
from qpart.kernels.packing import BLOCK_CODES, BLOCK_COLUMNS
from qpart.models.errors import PartitionError


@dataclass
class GraphParts:
    """Nodes and initializers being collected for one graph, with shared constants made once."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    shapes: dict[tuple[int, ...], str] = field(default_factory=dict)
    _names: set[str] = field(default_factory=set)
    _count: int = 0

    def value(self) -> str:
        """A fresh name for an intermediate value: lower-case letters, as short as they come
        (every node repeats its inputs' names; initializers are named ``t…``, ``q…``, ``r…`` and
        ``z…``, with a digit or a sign after the letter, so they never collide). The single
        letters ``q``, ``r`` and ``t`` are spelt ``qq``, ``rr`` and ``tt``, so those two-letter
        names are skipped when their turn comes."""
        while True:
            self._count += 1
            n, name = self._count, ""
            while n:
                n, d = divmod(n - 1, 26)
                name = chr(97 + d) + name
            if name not in ("qq", "rr", "tt"):
                return name + name if name in ("q", "r", "t") else name

    def add(self, op: str, inputs: list[str], **attrs: Any) -> str:
        """Append one node with one output; returns the output's name."""
        out = self.value()
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def constant(self, name: str, array: np.ndarray, *, scalar: bool = False) -> str:
        """An initializer named ``name`` (made once however often it is asked for). A 0-d array
        is stored with shape [1] unless ``scalar`` (an operator that needs a 0-d input: Clip)."""
        if name not in self._names:
            self._names.add(name)
            stored = np.asarray(array, order="C") if scalar else np.ascontiguousarray(array)
            self.initializers.append(numpy_helper.from_array(stored, name))
        return name


def _unpack_part(parts: GraphParts, packed: str, bits: int) -> str:
    """The rows of codes of a ``[k, bits, M]`` uint8 initializer: ``[k, 8, M]`` uint8 codes for
    b = 1, 2, 4; for b = 3, 5, 6, 7 ``[k, 8, M]`` (``[k, 8, 1, M]`` for 6, 7) float32
    ``(w >> o) + fraction``, which :func:`_finish` floors and reduces modulo ``2**b`` once for all
    parts of the tensor."""
    rows = [divmod(r * bits, 8) for r in range(8)]  # (byte row, bit offset) of each code row
    if 8 % bits == 0:  # no code straddles two bytes: uint8 shifts and a mask
        byte_rows = parts.constant(f"q{bits}i", np.array([t for t, _ in rows], np.int32))
        low = parts.add("Gather", [packed, byte_rows], axis=1)
        low = parts.add("BitShift", [low, parts.constant(f"q{bits}s", np.array(
            [o for _, o in rows], np.uint8).reshape(1, 8, 1))], direction="RIGHT")
        mask = parts.constant(f"q{bits}m", np.array((1 << bits) - 1, np.uint8))
        return parts.add("BitwiseAnd", [low, mask])
    # Each row joins its two bytes as byte[t] * 2**-o + byte[t + 1] * 2**(8 - o): exact in float32
    # (at most 16 + 7 significant bits, and every other term is zero). For b = 3, 5 one MatMul by
    # an [8, b] matrix does it; for b = 6, 7 a Gather of the two bytes ([k, 8, 2, M]) and a MatMul
    # by [8, 1, 2] take fewer bytes than that matrix.
    words = parts.add("Cast", [packed], to=TensorProto.FLOAT)
    if bits <= 5:
        select = np.zeros((8, bits), np.float32)
        for r, (t, o) in enumerate(rows):
            select[r, t] = 2.0**-o
            if t + 1 < bits:
                select[r, t + 1] = 2.0 ** (8 - o)
        return parts.add("MatMul", [parts.constant(f"q{bits}w", select), words])
    pairs = np.array([[t, min(t + 1, bits - 1)] for t, _ in rows], np.int32)
    coef = np.array([[[2.0**-o, 2.0 ** (8 - o)]] for _, o in rows], np.float32)
    words = parts.add("Gather", [words, parts.constant(f"q{bits}i", pairs)], axis=1)
    return parts.add("MatMul", [parts.constant(f"q{bits}w", coef), words])


def _finish(parts: GraphParts, value: str, bits: int) -> str:
    """Whole codes out of :func:`_unpack_part`'s float words (nothing to do for b = 1, 2, 4, 8)."""
    if 8 % bits == 0:
        return value
    value = parts.add("Floor", [value])
    modulus = parts.constant(f"q{bits}p", np.array(float(1 << bits), np.float32))
    return parts.add("Mod", [value, modulus], fmod=1)


def _codes(parts: GraphParts, name: str, packed: PackedTensor) -> tuple[str, int]:
    """The tensor's codes as one value of at least ``numel`` elements, and how many it holds."""
    bits, n, data = packed.scheme.bits, packed.numel, packed.data
    if bits == 8:  # identity layout: the codes are the bytes, padded to a multiple of 8
        return parts.constant(f"{name}c", data), data.size
    full, rem = divmod(n, BLOCK_CODES)
    pieces: list[str] = []
    cut = full * bits * BLOCK_COLUMNS
    if full:  # the full blocks as [k, b, 512], the last block as [1, b, m]: the same bytes, in order
        pieces.append(_unpack_part(parts, parts.constant(
            f"{name}c", data[:cut].reshape(full, bits, BLOCK_COLUMNS)), bits))
    if rem:
        m = (rem + 7) // 8
        pieces.append(_unpack_part(parts, parts.constant(
            f"{name}d" if full else f"{name}c", data[cut:].reshape(1, bits, m)), bits))
    held = full * BLOCK_CODES + 8 * ((rem + 7) // 8)
    if len(pieces) == 1:
        return _finish(parts, pieces[0], bits), held
    flat = parts.constant("q-1", np.array([-1], np.int64))
    joined = parts.add("Concat", [parts.add("Reshape", [p, flat]) for p in pieces], axis=0)
    return _finish(parts, joined, bits), held


def _shape(parts: GraphParts, shape: tuple[int, ...]) -> str:
    """A Reshape target, shared by every tensor of that shape."""
    key = tuple(shape)
    if key not in parts.shapes:
        parts.shapes[key] = parts.constant(f"r{len(parts.shapes)}", np.array(shape, np.int64))
    return parts.shapes[key]


def dequantize_nodes(parts: GraphParts, name: str, packed: PackedTensor) -> str:
    """Append the nodes that rebuild a float32 tensor from its packed form, as the value ``name``;
    its codes, scales and mins are the initializers ``name`` + ``c`` (``d`` for the last block of
    a tensor of more than 4096 codes), ``s`` and ``m``.

    Returns ``name``, a value of ``packed.shape``.

    Raises:
        PartitionError: the group size does not divide the tensor (never so for weights, whose
            groups are output channels).
    """
    shape, n, group = packed.shape, packed.numel, packed.scheme.group_size
    if n % group or packed.data.size != packed_size(n, packed.scheme.bits):
        raise PartitionError(f"tensor '{name}': group {group} does not divide its {n} elements")
    codes, held = _codes(parts, name, packed)
    if held != n:
        ends = parts.constant(f"q{n}", np.array([n], np.int64))
        codes = parts.add("Slice", [codes, parts.constant("q0", np.array([0], np.int64)), ends])
    per_channel = len(shape) >= 1 and group * shape[0] == n
    # Groups that are output channels broadcast as [C, 1, ...] against the tensor's own shape.
    grouped = shape if per_channel else (n // group, group)
    param_shape = (shape[0], *([1] * (len(shape) - 1))) if per_channel else (n // group, 1)
    values = parts.add("Reshape", [codes, _shape(parts, grouped)])
    if 8 % packed.scheme.bits == 0:  # uint8 codes; the others are float already
        values = parts.add("Cast", [values], to=TensorProto.FLOAT)
    values = parts.add("Mul", [values, parts.constant(f"{name}s", packed.scales.reshape(param_shape))])
    out = name if per_channel else parts.value()
    parts.nodes.append(helper.make_node(
        "Add", [values, parts.constant(f"{name}m", packed.mins.reshape(param_shape))], [out]))
    if not per_channel:
        parts.nodes.append(helper.make_node("Reshape", [out, _shape(parts, shape)], [name]))
    return name
