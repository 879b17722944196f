"""The ONNX form of a head segment (ADR 0012): its format, its operator allow-list, the caps a
device puts on it and what the check (:mod:`kernels.onnx_segment`) reports. Needs neither onnx nor
torch.

A segment is an ONNX model (opset 18) whose graph maps ``input`` (``[N, *input_shape]`` float32)
to ``activation`` (the head's output at the cut, float32); its quantized weights are initializers
holding the packed codes, scales and mins of the safetensors form, rebuilt in the graph
(:mod:`models.onnx_dequant`). ``producer_name`` and ``producer_version`` say the format and its
version; ``metadata_props`` carry ``model``, ``version``, ``cut`` and ``pattern_id``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class HeadRuntime(StrEnum):
    """What runs a device's head, and so which form of its segment the device downloads."""

    TORCH = "torch"
    """PyTorch: the device builds the head from shared model code and loads the safetensors
    segment's tensors into it (ADR 0003)."""
    ONNX = "onnx"
    """ONNX Runtime: the segment is the head's whole graph, checked before it runs (ADR 0012)."""


ONNX_SEGMENT_FORMAT = "qpart-segment-onnx"
ONNX_SEGMENT_FORMAT_VERSION = "1"
ONNX_OPSET = 18
ONNX_IR_VERSION = 8
INPUT_NAME = "input"
OUTPUT_NAME = "activation"

ALLOWED_OPS: dict[str, str] = {
    "Abs": "elementwise", "Elu": "activation", "Erf": "GELU (exact)", "Exp": "elementwise",
    "HardSigmoid": "MobileNetV3's gates", "HardSwish": "MobileNetV3's activation",
    "LeakyRelu": "activation", "Neg": "elementwise", "Reciprocal": "elementwise",
    "Sigmoid": "SiLU and squeeze-excitation gates", "Softplus": "activation", "Sqrt": "elementwise",
    "Tanh": "GELU (tanh form)",
    "Div": "elementwise", "Pow": "elementwise", "Sub": "elementwise",
    "Add": "residual sums; adds the mins when dequantizing",
    "AveragePool": "average pooling",
    "BatchNormalization": "a batch norm that was not folded into a convolution",
    "BitShift": "moving each code row's bits to the bottom of its byte (1, 2 and 4 bits)",
    "BitwiseAnd": "masking one code out of its byte (1, 2 and 4 bits)",
    "Cast": "packed bytes or codes to float32",
    "Clip": "ReLU6, between two scalar initializers 0 and 6",
    "Concat": "joining tensors (cat), the blocks of a tensor's codes, and an Expand's shape",
    "Conv": "2-D convolutions",
    "Expand": "broadcasting a parameter to the batch (a class token)",
    "Flatten": "flatten from axis 1",
    "Gather": "indexing (x[:, 0]); picking the byte rows that hold each code row",
    "Gemm": "linear layers",
    "GlobalAveragePool": "adaptive average pooling to 1x1",
    "Identity": "an output that is a value made earlier",
    "Floor": "dropping the bits below a straddling code (3, 5, 6 and 7 bits)",
    "LayerNormalization": "layer norm",
    "MatMul": "linear layers on 3-D inputs, attention; joining a straddling code's two bytes",
    "MaxPool": "max pooling",
    "Mod": "dropping the bits above a straddling code",
    "Mul": "gates, layer scale; multiplying codes by their group's scale",
    "Relu": "ReLU",
    "ReduceMax": "max over axes (not the batch)", "ReduceMean": "x.mean(dim) (not over the batch)",
    "ReduceSum": "x.sum(dim) (not over the batch)",
    "Reshape": "view and reshape; codes to the tensor's shape",
    "Shape": "the input's batch size, for an Expand",
    "Slice": "chunk and narrow; dropping the padding codes of a tensor",
    "Softmax": "attention",
    "Split": "unbind and chunk",
    "Squeeze": "unbind",
    "Transpose": "permute and transpose",
    "Unsqueeze": "adding an axis",
}
"""Every operator an ONNX segment may use, with what the builder uses it for. Nothing here reads
files, draws random numbers, or runs a subgraph."""


@dataclass(frozen=True)
class OnnxSegmentLimits:
    """Caps a device puts on an ONNX segment before it creates a session for it.

    Besides the bytes, every count the walk reads is capped, so that the check's work and memory
    are bounded by the caps, not by the bytes (a refused segment is refused quickly): protobuf
    records in all, nodes, initializers, entries of each repeated field. Packed arrays are checked
    with bytes operations. The real segments of both reference models (every cut and pattern) use at
    most 181 nodes, 95 initializers, 4 metadata entries, no value_info, 4 dimensions, 3 node inputs,
    2 attributes of a node, 4 values of an attribute and about 2,000 records.
    """

    max_bytes: int = 256 << 20
    max_nodes: int = 4096
    """Nodes of the graph; also the cap on its value_info entries."""
    max_initializers: int = 4096
    max_tensor_elements: int = 1 << 24
    """Elements of any one tensor: an initializer, or a node's output per sample (the batch
    dimension counted as 1), computed by :mod:`kernels.onnx_shapes`. The largest of the real
    segments of both reference models, over every cut and pattern, is 802,816 (fmnist-cnn, cut 7,
    as committed after issue 23's re-calibration); 2**24 (64 MB as float32) is 20 times that."""
    max_total_elements: int = 1 << 26
    """Elements of all the node outputs together, per sample: the per-tensor cap alone lets a graph
    of many tensors, each under it, ask for as much memory as it has nodes. The largest total of the
    real segments of both reference models, over every cut and pattern, is 3,983,882 (fmnist-cnn,
    cut 8); 2**26 (256 MB as float32) is 16 times that."""
    max_flops: int = 1 << 36
    """Estimated operations per sample of all the nodes together (:mod:`kernels.onnx_cost`, 2 per
    multiply-add as a model card counts FLOPs): the element caps bound memory, not work (ADR 0020).
    A device lowers it per plan to the head's declared FLOPs times a margin
    (:func:`client.onnx_runtime.work_budget`); this default, about 6.9e10, is the most any segment
    is given. The largest estimate of the real segments of the reference models is about 4.6e7
    (fmnist-resnet, its last cut)."""
    max_records: int = 1 << 18
    """Protobuf records the walk reads in all (a packed array is one)."""
    max_metadata: int = 64
    max_graph_values: int = 16
    """Inputs, outputs and opset imports of the model, each."""
    max_node_values: int = 64
    """Inputs and outputs of a node, each."""
    max_attributes: int = 32
    """Attributes of a node."""
    max_attribute_values: int = 64
    """Values of an ``ints``, ``floats`` or ``strings`` attribute."""
    max_dims: int = 8
    """Dimensions of a tensor's shape (an initializer's dims, a value's shape)."""


@dataclass(frozen=True)
class OnnxSegmentInfo:
    """What the check read from a segment that passed it."""

    metadata: dict[str, str]
    ops: frozenset[str]
    nodes: int
    initializers: int
    inputs: tuple[str, ...] = field(default=())
    outputs: tuple[str, ...] = field(default=())
    node_ops: tuple[tuple[str, str], ...] = field(default=())
    """``(op_type, domain)`` of each node, in order."""
    opset_domains: tuple[str, ...] = field(default=())
    """The domain of each ``opset_import``, in order."""
    flops: int = 0
    """The estimated operations per sample of all its nodes (:mod:`kernels.onnx_cost`), within
    :attr:`OnnxSegmentLimits.max_flops`."""
