"""Quantize, dequantize, pack and unpack kernels and the wire formats built on them.

The public API, each name loaded on first use (``qpart.lazy_face``): import from here, not from
the modules beside it.
"""

from typing import TYPE_CHECKING

from qpart.lazy_face import attach

if TYPE_CHECKING:
    from qpart.kernels.coding import CODING_BITS, Coding, decode, deflate, encode, inflate
    from qpart.kernels.errors import (
        DigestMismatchError,
        KernelError,
        OversizeError,
        QuantizationError,
        TruncatedError,
        UnsafeSegmentError,
        WireFormatError,
        WorkBudgetError,
    )
    from qpart.kernels.onnx_segment import (
        INPUT_NAME,
        ONNX_IR_VERSION,
        ONNX_OPSET,
        ONNX_SEGMENT_FORMAT,
        ONNX_SEGMENT_FORMAT_VERSION,
        OUTPUT_NAME,
        HeadRuntime,
        OnnxSegmentInfo,
        OnnxSegmentLimits,
        check_onnx_segment,
    )
    from qpart.kernels.ops import (
        BACKEND_ENV,
        ISA_ENV,
        Backend,
        PackedTensor,
        active_backend,
        fake_quantize,
        native_isa,
        native_isa_used,
        pack_codes,
        quantize_pack,
        unpack_codes,
        unpack_dequantize,
    )
    from qpart.kernels.packing import BLOCK_CODES, BLOCK_COLUMNS, packed_size
    from qpart.kernels.quantization import (
        DEFAULT_ACTIVATION_GROUP,
        QuantScheme,
        activation_group,
        weight_group_size,
    )
    from qpart.kernels.segment_format import SegmentHeader, decode_segment, encode_segment
    from qpart.kernels.wire import (
        decode_activation_array,
        encode_float_activation,
        encode_quantized_activation,
        float_packet_bytes,
        packet_bytes,
    )

__all__ = [
    "BACKEND_ENV",
    "BLOCK_CODES",
    "BLOCK_COLUMNS",
    "CODING_BITS",
    "DEFAULT_ACTIVATION_GROUP",
    "INPUT_NAME",
    "ISA_ENV",
    "ONNX_IR_VERSION",
    "ONNX_OPSET",
    "ONNX_SEGMENT_FORMAT",
    "ONNX_SEGMENT_FORMAT_VERSION",
    "OUTPUT_NAME",
    "Backend",
    "Coding",
    "DigestMismatchError",
    "HeadRuntime",
    "KernelError",
    "OnnxSegmentInfo",
    "OnnxSegmentLimits",
    "OversizeError",
    "PackedTensor",
    "QuantScheme",
    "QuantizationError",
    "SegmentHeader",
    "TruncatedError",
    "UnsafeSegmentError",
    "WireFormatError",
    "WorkBudgetError",
    "activation_group",
    "active_backend",
    "check_onnx_segment",
    "decode",
    "decode_activation_array",
    "decode_segment",
    "deflate",
    "encode",
    "encode_float_activation",
    "encode_quantized_activation",
    "encode_segment",
    "fake_quantize",
    "float_packet_bytes",
    "inflate",
    "native_isa",
    "native_isa_used",
    "pack_codes",
    "packed_size",
    "packet_bytes",
    "quantize_pack",
    "unpack_codes",
    "unpack_dequantize",
    "weight_group_size",
]

if not TYPE_CHECKING:  # mypy reads the imports above; a typed __getattr__ would hide misspellings
    __getattr__, __dir__ = attach(__name__, __file__)
