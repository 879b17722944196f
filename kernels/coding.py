"""Lossless coding of uploads: the HTTP ``deflate`` content coding (zlib, RFC 1950/1951).

A device may send an activation packet with ``Content-Encoding: deflate``: the packet's bytes as a
zlib stream. Quantized codes compress well where activations are sparse or flat (Fashion-MNIST's
background pixels quantize to code 0): the committed CNN artifact measured cut-0 packets at 0.64
of their size at 4 bits, 0.68 at 3 bits and 0.31 as float32 (``qpart measure-coding``, 500
calibration samples). The planner prices an upload at the size the calibration
measured (``CutProfile.deflate_ratio``), so the cut and bits it picks account for it.

:func:`inflate` parses bytes from the network: it never produces more than ``max_bytes`` (a small
stream can expand a thousandfold), and a stream that is corrupt, unfinished or followed by extra
bytes is refused.
"""

from __future__ import annotations

import zlib

from kernels.errors import OversizeError, TruncatedError, WireFormatError

LEVEL = 6  # zlib's default
DEFLATE = "deflate"  # the HTTP content coding's name
CODING_BITS = (*range(1, 9), 32)  # bit widths whose packets are measured (32: float32)


def deflate(data: bytes) -> bytes:
    """``data`` as a zlib stream (the HTTP ``deflate`` content coding)."""
    return zlib.compress(data, LEVEL)


def inflate(data: bytes, *, max_bytes: int) -> bytes:
    """The bytes a zlib stream holds, at most ``max_bytes`` of them.

    Raises:
        OversizeError: the stream holds more than ``max_bytes``.
        TruncatedError: the stream ends before its end marker and checksum.
        WireFormatError: not a zlib stream, a bad checksum, or bytes after the stream's end.
    """
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise WireFormatError(f"not a valid deflate (zlib) stream: {exc}") from None
    if len(out) > max_bytes:
        raise OversizeError(f"the deflate stream holds more than {max_bytes} bytes")
    if not inflater.eof:
        raise TruncatedError("the deflate stream ends before its end marker and checksum")
    if inflater.unused_data:
        raise WireFormatError(f"{len(inflater.unused_data)} bytes follow the end of the deflate stream")
    return out
