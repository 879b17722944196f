"""A head, cut from the fx graph, written as an ONNX model whose weights stay packed (ADR 0012, 0019).

``torch.onnx.export`` (the TorchScript exporter, opset 18) translates the head, whatever ATen
operators it uses, once per head (cached). The float graph it writes is then made a segment:

- every head tensor it reads (by its parameter or buffer name; the exporter's de-duplicating
  ``Identity`` aliases resolved) is replaced by the segment's own: a quantized weight by its packed
  codes, scales and mins plus the nodes that rebuild it (:mod:`models.onnx_dequant`), any other by a
  float32 initializer (an integer buffer, such as a relative-position index, keeps its integer type);
- the size arithmetic the exporter writes for ``x.shape`` (``Shape``, ``Gather``, ``Concat``, ...)
  is worked out here (:mod:`models.onnx_fold`), leaving constants, a ``-1`` in a ``Reshape``, or
  the input's batch for an ``Expand``;
- ``Constant`` nodes become initializers, values get short names, attributes at ONNX's defaults
  and node names are dropped: a small head's graph stays near its safetensors segment's size.

A head the exporter cannot translate, or whose sizes depend on the batch in another way, is
refused with :class:`PartitionError` saying why.
"""

from __future__ import annotations

import io
import threading
import warnings
import weakref
from collections.abc import Mapping

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from torch import fx

from qpart.kernels import PackedTensor
from qpart.kernels.onnx_segment import (
    INPUT_NAME,
    ONNX_IR_VERSION,
    ONNX_OPSET,
    ONNX_SEGMENT_FORMAT,
    ONNX_SEGMENT_FORMAT_VERSION,
    OUTPUT_NAME,
)
from qpart.models.errors import PartitionError
from qpart.models.onnx_dequant import GraphParts, dequantize_nodes
from qpart.models.onnx_fold import Folded, constant_values, fold_sizes

_DEFAULTS: dict[str, dict[str, object]] = {
    op: {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1, "ceil_mode": 0,
         "auto_pad": b"NOTSET"} for op in ("Conv", "MaxPool", "AveragePool")}
_DEFAULTS["Gemm"] = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}
_DEFAULTS["Reshape"] = {"allowzero": 0}
_DEFAULTS["LayerNormalization"] = {"axis": -1, "stash_type": 1}
_DEFAULTS["Softmax"] = {"axis": -1}
_DEFAULTS["Gather"] = {"axis": 0}
_DEFAULTS["Split"] = {"axis": 0}

_lock = threading.Lock()  # the TorchScript exporter keeps global state
_exported: weakref.WeakKeyDictionary[fx.GraphModule, tuple[tuple[int, ...], onnx.ModelProto]] = \
    weakref.WeakKeyDictionary()


def export_head(head: fx.GraphModule, input_shape: tuple[int, ...]) -> onnx.ModelProto:
    """The head's float graph as ``torch.onnx.export`` writes it: ``input`` ``[N, *input_shape]``
    → ``activation`` (cached per head).

    Raises:
        PartitionError: the exporter cannot translate the head (its message, one line).
    """
    with _lock:
        cached = _exported.get(head)
        if cached is not None and cached[0] == input_shape:
            return cached[1]
        buffer = io.BytesIO()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
                # the TorchScript exporter writes to a file object too; the stubs name paths only
                torch.onnx.export(head, (torch.zeros((1, *input_shape)),), buffer,  # type: ignore[arg-type]
                                  dynamo=False, opset_version=ONNX_OPSET, input_names=[INPUT_NAME],
                                  output_names=[OUTPUT_NAME], dynamic_axes={INPUT_NAME: {0: "N"}},
                                  do_constant_folding=False)
        except Exception as exc:  # the exporter raises many types for what it cannot translate
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise PartitionError(f"torch.onnx.export cannot translate the head: {first[:300]}") from exc
        model = onnx.load_from_string(buffer.getvalue())
        _exported[head] = (input_shape, model)
        return model


def head_to_onnx(head: fx.GraphModule, input_shape: tuple[int, ...], quantized: Mapping[str, PackedTensor],
                 floats: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> onnx.ModelProto:
    """The head as an ONNX segment: ``input`` ``[N, *input_shape]`` → ``activation``.

    Args:
        head: the head module cut by :func:`models.partition.split`.
        input_shape: one sample's input shape.
        quantized: the packed weights, by parameter name (as in the safetensors segment).
        floats: every other head tensor, by name.
        metadata: ``metadata_props`` (model, version, cut, pattern id).
    """
    exported = export_head(head, input_shape)
    rewrite = _Rewrite(exported, quantized, floats)
    for node in exported.graph.node:
        rewrite.node(node)
    output = rewrite.name(exported.graph.output[0].name)
    _rename_output(rewrite.parts, output)
    return _model(rewrite.parts, input_shape, metadata)


class _Rewrite:
    """The exported graph made a segment, node by node (see the module's description)."""

    def __init__(self, exported: onnx.ModelProto, quantized: Mapping[str, PackedTensor],
                 floats: Mapping[str, np.ndarray]) -> None:
        self.quantized, self.floats = quantized, floats
        self.parts = GraphParts()
        self.constants = constant_values(exported)
        self.aliases = {n.output[0]: n.input[0] for n in exported.graph.node
                        if n.op_type == "Identity" and n.input[0] in self.constants}
        self.weights = frozenset(quantized) | frozenset(floats)
        self.folded: Folded = fold_sizes(exported, self.weights, self.constants)
        self.names: dict[str, str] = {INPUT_NAME: INPUT_NAME}
        self.tensors: dict[str, str] = {}
        self.batch: str | None = None
        self.shared: dict[tuple[str, tuple[int, ...], bytes], str] = {}

    def node(self, node: onnx.NodeProto) -> None:
        if node.op_type == "Constant" or (node.op_type == "Identity" and node.output[0] in self.aliases):
            return
        if all(out in self.folded.values for out in node.output if out):
            return  # worked out here; its consumers read the value
        if node.op_type == "Identity":  # dropout and identity modules: the same value
            self.names[node.output[0]] = self.input(node, 0, node.input[0])
            return
        inputs = [self.input(node, i, name) for i, name in enumerate(node.input)]
        outputs = [self.parts.value() if out else "" for out in node.output]
        for out, short in zip(node.output, outputs, strict=True):
            if out:
                self.names[out] = short
        defaults = _DEFAULTS.get(node.op_type, {})
        attributes = [a for a in node.attribute if defaults.get(a.name, ...) != helper.get_attribute_value(a)
                      and not (node.op_type == "Conv" and a.name == "kernel_shape")]
        made = helper.make_node(node.op_type, inputs, outputs)
        made.attribute.extend(attributes)
        self.parts.nodes.append(made)

    def name(self, value: str) -> str:
        """The short name of an exported value that a node made."""
        if value in self.names:
            return self.names[value]
        return self.input(None, 0, value)

    def input(self, node: onnx.NodeProto | None, index: int, value: str) -> str:
        """The name a rewritten node reads for the exported value ``value`` (its ``index``-th
        input)."""
        if not value:
            return ""
        if value not in self.weights:  # a head tensor named by an exporter alias is still its own
            value = self.aliases.get(value, value)
        if value in self.weights:
            return self.tensor(value)
        if value in self.names:
            return self.names[value]
        if value in self.folded.values:
            return self.sized(node, index, value)
        raise PartitionError(f"the exported head reads {value!r}, which nothing makes")

    def tensor(self, name: str) -> str:
        """A head tensor's value, made on first use (dequantized if packed)."""
        if name not in self.tensors:  # short value names: every node that reads one repeats it
            short = f"t{len(self.tensors)}"
            if name in self.quantized:
                self.tensors[name] = dequantize_nodes(self.parts, short, self.quantized[name])
            else:
                array = np.asarray(self.floats[name], self._dtype(name))
                self.tensors[name] = self.parts.constant(short, array, scalar=array.ndim == 0)
        return self.tensors[name]

    def _dtype(self, name: str) -> np.dtype[np.generic]:
        """The type a head tensor has in the segment: the exported graph's where that is an integer
        (an index buffer, which Gather reads as indices: the segment carries it as float32, exact up
        to 2**24), else float32."""
        exported = self.constants.get(name)
        if exported is not None and exported.dtype.kind in "iu":
            return exported.dtype
        return np.dtype(np.float32)

    def sized(self, node: onnx.NodeProto | None, index: int, value: str) -> str:
        """A value worked out here: a constant, a ``Reshape`` target with ``-1`` for the batch, or
        an ``Expand`` shape with the input's batch."""
        constant = self.folded.constant(value)
        op = node.op_type if node is not None else "output"
        if constant is not None:
            return self._constant(constant)
        if node is not None and op == "Reshape" and index == 1:
            return self._constant(self.folded.reshape_target(value, node.input[0]))
        if op == "Expand" and index == 1:
            shape, at = self.folded.batch_shape(value)
            pieces = ([self._constant(shape[:at])] if at else []) + [self._batch()] + \
                ([self._constant(shape[at + 1:])] if at + 1 < len(shape) else [])
            return self.parts.add("Concat", pieces, axis=0)
        raise PartitionError(f"{op} reads a value that depends on the batch size; the segment format "
                             "carries such values only as Reshape and Expand shapes")

    def _constant(self, array: np.ndarray) -> str:
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self.shared:  # one initializer per distinct constant
            self.shared[key] = self.parts.constant(f"k{len(self.parts.initializers)}", array,
                                                   scalar=array.ndim == 0)
        return self.shared[key]

    def _batch(self) -> str:
        if self.batch is None:
            self.batch = self.parts.add("Shape", [INPUT_NAME], end=1)
        return self.batch


def _rename_output(parts: GraphParts, output: str) -> None:
    producer = next((n for n in parts.nodes if output in n.output), None)
    if producer is None:  # the head returns its input or a tensor: an explicit copy
        parts.nodes.append(helper.make_node("Identity", [output], [OUTPUT_NAME]))
        return
    producer.output[list(producer.output).index(output)] = OUTPUT_NAME
    for n in parts.nodes:
        for i, name in enumerate(n.input):
            if name == output:
                n.input[i] = OUTPUT_NAME


def _model(parts: GraphParts, input_shape: tuple[int, ...], metadata: Mapping[str, str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        parts.nodes, "",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", *input_shape])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, None)],
        parts.initializers)
    # The format and its version are the producer's name and version: two fields the model has
    # anyway, where metadata keys would cost 28 bytes of a 1 KB segment's 50-byte allowance.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              ir_version=ONNX_IR_VERSION, producer_name=ONNX_SEGMENT_FORMAT,
                              producer_version=ONNX_SEGMENT_FORMAT_VERSION)
    helper.set_model_props(model, dict(sorted(metadata.items())))
    return model
