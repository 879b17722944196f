"""Lossless coding of uploads: the HTTP ``deflate`` (zlib, RFC 1950/1951) and ``zstd`` (RFC 8878)
content codings.

A device may send an activation packet with ``Content-Encoding: deflate`` or ``zstd``. Quantized
codes compress well where activations are sparse or flat (Fashion-MNIST's background pixels
quantize to code 0); zstd shrinks them a little less than deflate in a fraction of the device
time (ADR 0007). The planner prices an upload at the size the calibration measured
(``CutProfile.coding_ratio``) plus the device's measured coding time (``MeasuredHeads.coding_s``).

:func:`decode` parses bytes from the network: it never produces more than ``max_bytes`` (a small
stream can expand a thousandfold), and a stream that is corrupt, unfinished or followed by extra
bytes is refused.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from enum import StrEnum
from typing import Protocol

import zstandard

from qpart.kernels.errors import OversizeError, TruncatedError, WireFormatError

LEVEL = 6  # zlib's default
ZSTD_LEVEL = 1  # zstd's fastest positive level: 4-bit cut-0 packets 0.666 of raw against 0.664 at 3
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a Zstandard frame's first four bytes (RFC 8878 3.1.1)
ZSTD_MAX_WINDOW = 1 << 23  # a frame may not ask the decoder for more history than this (8 MiB)
CODING_BITS = (*range(1, 9), 32)  # bit widths whose packets are measured (32: float32)


class Coding(StrEnum):
    """An HTTP content coding a device may upload an activation packet with.

    The one list of upload codings (ADR 0008): the plan request's offered codings, the plan's
    ``upload_encoding``, the device's settings, the calibration's ratios
    (``CutProfile.coding_ratio``) and the device profile's times (``MeasuredHeads.coding_s``) are
    all keyed by it. A new coding is a member here, its :data:`_ENCODERS` and :data:`_DECODERS`
    entries, and its measurement (``qpart measure-coding``, ``qpart device profile``).
    """

    DEFLATE = "deflate"
    """A zlib stream (RFC 1950/1951): the smaller packet, at four times zstd's device time."""
    ZSTD = "zstd"
    """One Zstandard frame (RFC 8878) at :data:`ZSTD_LEVEL`, declaring its content size."""


# A zstd context per thread: creating one costs more than compressing a packet. The one piece of
# module state in kernels, a cache with no observable effect (ADR 0007).
_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    ctx: zstandard.ZstdCompressor | None = getattr(_local, "zstd", None)
    if ctx is None:
        ctx = _local.zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return ctx


def deflate(data: bytes) -> bytes:
    """``data`` as a zlib stream (the HTTP ``deflate`` content coding)."""
    return zlib.compress(data, LEVEL)


def zstd_compress(data: bytes) -> bytes:
    """``data`` as one Zstandard frame that records its content size (the HTTP ``zstd`` coding)."""
    return _compressor().compress(data)


def coding_of(name: Coding | str) -> Coding:
    """The :class:`Coding` called ``name``.

    Raises:
        WireFormatError: no coding has that name.
    """
    try:
        return Coding(name)
    except ValueError as exc:
        known = ", ".join(c.value for c in Coding)
        raise WireFormatError(f"unknown content coding {name!r}: use one of {known}") from exc


def encode(data: bytes, coding: Coding | str) -> bytes:
    """``data`` in ``coding`` (:func:`coding_of` names the error for an unknown one)."""
    return _ENCODERS[coding_of(coding)](data)


def decode(data: bytes, coding: Coding | str, *, max_bytes: int) -> bytes:
    """The bytes ``data`` holds in ``coding``, at most ``max_bytes`` of them (see :func:`inflate`,
    :func:`zstd_decompress`)."""
    return _DECODERS[coding_of(coding)](data, max_bytes=max_bytes)


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
        raise WireFormatError(f"not a valid deflate (zlib) stream: {exc}") from exc
    if len(out) > max_bytes:
        raise OversizeError(f"the deflate stream holds more than {max_bytes} bytes")
    if not inflater.eof:
        raise TruncatedError("the deflate stream ends before its end marker and checksum")
    if inflater.unused_data:
        raise WireFormatError(f"{len(inflater.unused_data)} bytes follow the end of the deflate stream")
    return out


def zstd_decompress(data: bytes, *, max_bytes: int) -> bytes:
    """The bytes one Zstandard frame holds, at most ``max_bytes`` of them.

    A frame that declares its content size is refused past ``max_bytes`` before any decoding; one
    that does not is first read through a reader that stops after ``max_bytes + 1`` bytes (and then
    decoded a second time, for its end and trailing bytes: this project's encoder always declares
    the size, so only foreign encoders pay for that). Frames asking for more than
    :data:`ZSTD_MAX_WINDOW` of history are refused, on either path.

    Raises:
        OversizeError: the frame holds more than ``max_bytes``.
        TruncatedError: the input ends before the frame's header or its end.
        WireFormatError: not a Zstandard frame, corrupt, or bytes after the frame's end.
    """
    size = _zstd_content_size(data)
    if size > max_bytes:
        raise OversizeError(f"the zstd frame holds {size} bytes, more than {max_bytes}")
    ctx = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
    try:
        if size > 0:  # (a declared 0 returns b"" in the library before trailing bytes are checked)
            return ctx.decompress(data, allow_extra_data=False)
        if size < 0:  # unknown: find out, reading no more than one byte past the limit, then decode
            with ctx.stream_reader(data, read_across_frames=False) as reader:
                if len(reader.read(max_bytes + 1)) > max_bytes:
                    raise OversizeError(f"the zstd frame holds more than {max_bytes} bytes")
        # A declared 0 needs no reader: libzstd fails a block that decodes past the declared size,
        # and a reader would run on into a frame behind it.
        stream = ctx.decompressobj()
        out = stream.decompress(data)
    except zstandard.ZstdError as exc:
        raise _zstd_error(str(exc)) from exc
    if not stream.eof:
        raise TruncatedError("the zstd frame ends before its last block")
    if stream.unused_data:
        raise WireFormatError(f"{len(stream.unused_data)} bytes follow the end of the zstd frame")
    return out


def _zstd_content_size(data: bytes) -> int:
    """The content size a frame header declares; -1 when it declares none."""
    if len(data) < 4:
        raise TruncatedError("the zstd frame ends before its magic number")
    if data[:4] != ZSTD_MAGIC:  # skippable frames too: their length field would size the output
        raise WireFormatError("not a zstd frame: it does not start with the magic number 28 b5 2f fd")
    try:
        return int(zstandard.frame_content_size(data))
    except zstandard.ZstdError as exc:
        raise TruncatedError(f"the zstd frame header is incomplete: {exc}") from exc


def _zstd_error(message: str) -> WireFormatError:
    """The typed error for a zstandard library error. python-zstandard exposes no error codes, so
    the message picks the subclass; an unrecognised one is still a :class:`WireFormatError`."""
    if "did not decompress full frame" in message:
        return TruncatedError("the zstd frame ends before its last block")
    if "unused data" in message:
        return WireFormatError(f"bytes follow the end of the zstd frame: {message}")
    return WireFormatError(f"not a valid zstd frame: {message}")


class _Decoder(Protocol):
    def __call__(self, data: bytes, *, max_bytes: int) -> bytes: ...


_ENCODERS: dict[Coding, Callable[[bytes], bytes]] = {Coding.DEFLATE: deflate, Coding.ZSTD: zstd_compress}
_DECODERS: dict[Coding, _Decoder] = {Coding.DEFLATE: inflate, Coding.ZSTD: zstd_decompress}
