"""Exception tree of the ``kernels`` package.

::

    KernelError
    ├── QuantizationError      input the quantizer cannot represent (NaN, infinity, bad bits)
    └── WireFormatError        bytes that are not a valid segment or activation packet
        ├── TruncatedError     shorter than its header or its declared contents
        ├── OversizeError      a declared size beyond the configured limits
        │   └── WorkBudgetError  an ONNX segment whose estimated work per sample is over its budget
        ├── DigestMismatchError  bytes that do not hash to the content id they were fetched by
        └── UnsafeSegmentError   an ONNX segment that could read files or run operators outside
                                 the allow-list (external data, a custom domain, a subgraph)

Every one is a ``ValueError`` too, so callers that only know the standard library still catch it.
"""

from __future__ import annotations


class KernelError(ValueError):
    """Base class of every error raised by :mod:`kernels`."""


class QuantizationError(KernelError):
    """The tensor or the parameters cannot be quantized (non-finite values, bits out of 1..8)."""


class WireFormatError(KernelError):
    """Bytes that do not parse as the declared wire format, or are inconsistent with themselves."""


class TruncatedError(WireFormatError):
    """The input ends before its header or its declared contents do."""


class OversizeError(WireFormatError):
    """A declared size (elements, dimensions, header) exceeds the parser's limits."""


class WorkBudgetError(OversizeError):
    """An ONNX segment whose nodes' estimated operations per sample (:mod:`kernels.onnx_cost`) add
    up to more than the budget the device gave it (ADR 0020): memory within the caps, but hours of
    work."""


class DigestMismatchError(WireFormatError):
    """The bytes' sha256 is not the content id they were asked for (corrupt, truncated or swapped)."""


class UnsafeSegmentError(WireFormatError):
    """An ONNX segment reaches beyond its own bytes or beyond the documented operator allow-list."""
