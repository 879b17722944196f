"""A head, cut from the fx graph, written as an ONNX model whose weights stay packed (ADR 0012).

The translation walks the head's fx graph node by node: each module or function it knows becomes
one ONNX operator of :data:`kernels.onnx_segment.ALLOWED_OPS`; a quantized weight becomes its
packed codes, scales and mins plus the nodes that rebuild it (:mod:`models.onnx_dequant`); a
float tensor is an initializer. Dropout and identity modules are aliases, not nodes. A head with
an operation outside the table is refused with :class:`PartitionError` naming it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from torch import fx, nn

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

_RELU_FUNCTIONS = {torch.relu, nn.functional.relu}
_ADD_FUNCTIONS = {operator.add, torch.add}
_ALIAS_MODULES = (nn.Dropout, nn.Identity)


def _pair(value: int | tuple[int, ...]) -> list[int]:
    return [value, value] if isinstance(value, int) else list(value)


def _conv(parts: GraphParts, mod: nn.Module, x: str, w: str, b: str | None) -> str:
    if not isinstance(mod, nn.Conv2d) or mod.padding_mode != "zeros" or isinstance(mod.padding, str):
        raise PartitionError(f"a convolution with padding {getattr(mod, 'padding', '?')!r} has no "
                             "ONNX translation here")
    pad = _pair(mod.padding)
    attrs = _non_default(strides=_pair(mod.stride), pads=[pad[0], pad[1], pad[0], pad[1]],
                         dilations=_pair(mod.dilation), group=mod.groups)
    return parts.add("Conv", [x, w, *([b] if b else [])], **attrs)


_DEFAULTS: dict[str, object] = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
                                "ceil_mode": 0}


def _non_default(**attrs: object) -> dict[str, object]:
    """The attributes that differ from ONNX's defaults: every byte of a small head's graph counts
    against the segment's size (kernel shapes are read from the weights)."""
    return {k: v for k, v in attrs.items() if _DEFAULTS.get(k) != v}


def _module_node(parts: GraphParts, mod: nn.Module, target: str, x: str,
                 tensor: Callable[[str], str]) -> str:
    """One call_module node as ONNX; ``tensor`` names a head tensor (dequantized if need be)."""
    bias = f"{target}.bias" if getattr(mod, "bias", None) is not None else None
    if isinstance(mod, nn.Conv2d):
        return _conv(parts, mod, x, tensor(f"{target}.weight"), tensor(bias) if bias else None)
    if isinstance(mod, nn.Linear):
        return parts.add("Gemm", [x, tensor(f"{target}.weight"), *([tensor(bias)] if bias else [])], transB=1)
    if isinstance(mod, nn.ReLU):
        return parts.add("Relu", [x])
    if isinstance(mod, nn.ReLU6):  # MobileNetV2's activation: min(max(x, 0), 6)
        return parts.add("Clip", [x, parts.constant("z0", np.array(0.0, np.float32), scalar=True),
                                   parts.constant("z6", np.array(6.0, np.float32), scalar=True)])
    if isinstance(mod, nn.MaxPool2d) and not mod.return_indices:
        pad = _pair(mod.padding)
        return parts.add("MaxPool", [x], kernel_shape=_pair(mod.kernel_size), **_non_default(
            strides=_pair(mod.stride or mod.kernel_size), pads=[pad[0], pad[1], pad[0], pad[1]],
            dilations=_pair(mod.dilation), ceil_mode=int(mod.ceil_mode)))
    if isinstance(mod, nn.AdaptiveAvgPool2d) and _pair(mod.output_size) == [1, 1]:  # type: ignore[arg-type]
        return parts.add("GlobalAveragePool", [x])
    if isinstance(mod, nn.Flatten) and mod.start_dim == 1 and mod.end_dim == -1:
        return parts.add("Flatten", [x], axis=1)
    if isinstance(mod, nn.BatchNorm2d) and mod.track_running_stats and mod.affine:
        names = [f"{target}.{k}" for k in ("weight", "bias", "running_mean", "running_var")]
        return parts.add("BatchNormalization", [x, *map(tensor, names)], epsilon=float(mod.eps))
    raise PartitionError(f"module '{target}' ({type(mod).__name__}) has no ONNX translation here")


def _function_node(parts: GraphParts, node: fx.Node, value: Callable[[object], str]) -> str:
    if node.op == "call_function" and node.target in _RELU_FUNCTIONS and len(node.args) == 1:
        return parts.add("Relu", [value(node.args[0])])
    if node.op == "call_function" and node.target in _ADD_FUNCTIONS and len(node.args) == 2 \
            and not node.kwargs:
        return parts.add("Add", [value(a) for a in node.args])
    if node.target is nn.functional.adaptive_avg_pool2d and len(node.args) == 2 \
            and node.args[1] in (1, (1, 1), [1, 1]):
        return parts.add("GlobalAveragePool", [value(node.args[0])])
    if node.target in (torch.flatten, "flatten") and tuple(node.args[1:]) == (1,):
        return parts.add("Flatten", [value(node.args[0])], axis=1)
    if node.op == "call_method" and node.target == "relu":
        return parts.add("Relu", [value(node.args[0])])
    raise PartitionError(f"operation '{node.target}' of node '{node.name}' has no ONNX translation here")


class _Translation:
    """The state of one head's translation: the graph so far and the names of its values."""

    def __init__(self, head: fx.GraphModule, quantized: Mapping[str, PackedTensor],
                 floats: Mapping[str, np.ndarray]) -> None:
        self.head, self.quantized, self.floats = head, quantized, floats
        self.parts = GraphParts()
        self.tensors: dict[str, str] = {}
        self.env: dict[fx.Node, str] = {}

    def tensor(self, name: str) -> str:
        """A head tensor's value, made on first use (dequantized if packed)."""
        if name not in self.tensors:  # short value names: every node that reads one repeats it
            short = f"t{len(self.tensors)}"
            if name in self.quantized:
                self.tensors[name] = dequantize_nodes(self.parts, short, self.quantized[name])
            elif name in self.floats:
                self.tensors[name] = self.parts.constant(short, np.asarray(self.floats[name], np.float32))
            else:
                raise PartitionError(f"the head uses tensor '{name}', which the segment lacks")
        return self.tensors[name]

    def value(self, arg: object) -> str:
        """The value an fx argument names."""
        if not isinstance(arg, fx.Node):
            raise PartitionError(f"a constant argument {arg!r} has no ONNX translation here")
        return self.env[arg]

    def node(self, node: fx.Node) -> str | None:
        """Translate one fx node; the graph's output value for the output node, else None."""
        if node.op == "placeholder":
            self.env[node] = INPUT_NAME
        elif node.op == "get_attr":
            self.env[node] = self.tensor(str(node.target))
        elif node.op == "call_module":
            mod = self.head.get_submodule(str(node.target))
            x = self.value(node.args[0])
            self.env[node] = x if isinstance(mod, _ALIAS_MODULES) else _module_node(
                self.parts, mod, str(node.target), x, self.tensor)
        elif node.op in ("call_function", "call_method"):
            self.env[node] = _function_node(self.parts, node, self.value)
        elif node.op == "output":
            return self.value(node.args[0])
        return None


def head_to_onnx(head: fx.GraphModule, input_shape: tuple[int, ...], quantized: Mapping[str, PackedTensor],
                 floats: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> onnx.ModelProto:
    """The head as an ONNX model: ``input`` ``[N, *input_shape]`` → ``activation``.

    Args:
        head: the head module cut by :func:`models.partition.split`.
        input_shape: one sample's input shape.
        quantized: the packed weights, by parameter name (as in the safetensors segment).
        floats: every other head tensor, by name.
        metadata: ``metadata_props`` (model, version, cut, pattern id).
    """
    translation = _Translation(head, quantized, floats)
    outputs = [translation.node(node) for node in head.graph.nodes]
    output = next((o for o in outputs if o is not None), None)
    if output is None:
        raise PartitionError("the head has no output")
    _rename_output(translation.parts, output)
    return _model(translation.parts, input_shape, metadata)


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
