"""Quantize, dequantize, pack and unpack kernels and the wire formats built on them."""

from qpart.kernels.coding import Coding, decode, deflate, encode, inflate
from qpart.kernels.errors import (
    KernelError,
    OversizeError,
    QuantizationError,
    TruncatedError,
    WireFormatError,
)
from qpart.kernels.ops import (
    Backend,
    PackedTensor,
    active_backend,
    fake_quantize,
    pack_codes,
    quantize_pack,
    unpack_codes,
    unpack_dequantize,
)
from qpart.kernels.packing import packed_size
from qpart.kernels.quantization import (
    DEFAULT_ACTIVATION_GROUP,
    QuantScheme,
    activation_group,
    weight_group_size,
)

__all__ = [
    "DEFAULT_ACTIVATION_GROUP",
    "Backend",
    "Coding",
    "KernelError",
    "OversizeError",
    "PackedTensor",
    "QuantScheme",
    "QuantizationError",
    "TruncatedError",
    "WireFormatError",
    "activation_group",
    "active_backend",
    "decode",
    "deflate",
    "encode",
    "fake_quantize",
    "inflate",
    "pack_codes",
    "packed_size",
    "quantize_pack",
    "unpack_codes",
    "unpack_dequantize",
    "weight_group_size",
]
