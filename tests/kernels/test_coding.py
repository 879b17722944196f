"""The deflate and zstd content codings: round trips, and bytes from the network never crash or
balloon."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from qpart.kernels.coding import (
    ZSTD_MAGIC,
    Coding,
    decode,
    deflate,
    encode,
    inflate,
    zstd_compress,
    zstd_decompress,
)
from qpart.kernels.errors import OversizeError, TruncatedError, WireFormatError
from qpart.kernels.wire import decode_activation_array, encode_quantized_activation

CODINGS = list(Coding)


@pytest.mark.parametrize("coding", CODINGS)
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=4096))
def test_round_trip(coding, data):
    assert decode(encode(data, coding), coding, max_bytes=len(data)) == data


@pytest.mark.parametrize("coding", CODINGS)
@settings(max_examples=1000, deadline=None)
@given(data=st.binary(max_size=512), limit=st.integers(0, 4096))
def test_garbage_is_refused_with_a_typed_error_and_never_exceeds_the_limit(coding, data, limit):
    try:
        out = decode(data, coding, max_bytes=limit)
    except WireFormatError:  # TruncatedError and OversizeError are WireFormatErrors too
        return
    assert len(out) <= limit


@settings(max_examples=1000, deadline=None)
@given(body=st.binary(max_size=512), limit=st.integers(0, 4096))
def test_garbage_behind_a_zstd_magic_number_is_refused_or_bounded(body, limit):
    # Random bytes rarely start with the magic number; these always reach the frame parser.
    try:
        out = zstd_decompress(b"\x28\xb5\x2f\xfd" + body, max_bytes=limit)
    except WireFormatError:
        return
    assert len(out) <= limit


@pytest.mark.parametrize("coding", CODINGS)
@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=1, max_size=2048), cut=st.integers(0, 10_000), flip=st.integers(0, 255))
def test_damaged_streams_are_refused_or_decode_within_the_limit(coding, data, cut, flip):
    stream = bytearray(encode(data, coding))
    stream[cut % len(stream)] ^= flip or 1
    try:
        out = decode(bytes(stream), coding, max_bytes=len(data))
    except WireFormatError:
        return
    # zlib checks an adler32; a zstd frame without a checksum may decode a damaged literal.
    assert len(out) <= len(data)
    if coding is Coding.DEFLATE:
        assert out == data


def _zstd_unsized(data: bytes) -> bytes:
    buf = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(buf, closefd=False) as writer:
        writer.write(data)
    return buf.getvalue()


@pytest.mark.parametrize("bomb", [
    pytest.param(zlib.compress(b"\0" * 50_000_000, 9), id="deflate"),
    pytest.param(zstandard.ZstdCompressor(level=19).compress(b"\0" * 50_000_000), id="zstd-sized"),
    pytest.param(_zstd_unsized(b"\0" * 50_000_000), id="zstd-unsized"),
])
def test_a_small_bomb_is_cut_off_at_the_limit(bomb):
    assert len(bomb) < 60_000
    coding = Coding.DEFLATE if bomb[:4] != b"\x28\xb5\x2f\xfd" else Coding.ZSTD
    with pytest.raises(OversizeError, match="more than 1000000"):
        decode(bomb, coding, max_bytes=1_000_000)


@pytest.mark.parametrize("n", [0, 1, 1000])
@pytest.mark.parametrize("coder", [deflate, zstd_compress, _zstd_unsized])
def test_the_limit_is_exact(n, coder):
    coding = Coding.DEFLATE if coder is deflate else Coding.ZSTD
    assert decode(coder(b"x" * n), coding, max_bytes=n) == b"x" * n
    with pytest.raises(OversizeError):
        decode(coder(b"x" * (n + 1)), coding, max_bytes=n)


def test_truncated_and_trailing_bytes():
    stream = deflate(b"activation" * 50)
    with pytest.raises(TruncatedError):
        inflate(stream[:-3], max_bytes=10_000)
    with pytest.raises(TruncatedError):
        inflate(b"", max_bytes=10_000)
    with pytest.raises(WireFormatError, match="follow the end"):
        inflate(stream + b"x", max_bytes=10_000)
    with pytest.raises(WireFormatError, match="not a valid"):
        inflate(b"QPA\x01garbage", max_bytes=10_000)


@pytest.mark.parametrize("coder", [zstd_compress, _zstd_unsized])
def test_zstd_truncated_and_trailing_bytes(coder):
    frame = coder(b"activation" * 50)
    for short in (frame[:-3], frame[:6], frame[:2], b""):
        with pytest.raises(TruncatedError):
            zstd_decompress(short, max_bytes=10_000)
    for extra in (frame + b"x", frame + frame):
        with pytest.raises(WireFormatError, match="follow the end"):
            zstd_decompress(extra, max_bytes=10_000)
    with pytest.raises(WireFormatError, match="not a zstd frame"):
        zstd_decompress(b"QPA\x01garbage", max_bytes=10_000)


def test_a_zstd_frame_asking_for_a_huge_window_is_refused():
    # Without a content size the frame's window descriptor says 128 MiB of history.
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=27)
    buf = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(buf, closefd=False) as writer:
        writer.write(bytes(range(256)) * 4000)
    with pytest.raises(WireFormatError, match="not a valid"):
        zstd_decompress(buf.getvalue(), max_bytes=1 << 22)


@pytest.mark.parametrize("coding", CODINGS)
def test_a_packet_survives_the_coding_and_shrinks_where_activations_are_sparse(coding):
    x = np.zeros((1, 1, 28, 28), dtype=np.float32)
    x[0, 0, 8:20, 8:20] = np.random.default_rng(0).random((12, 12), dtype=np.float32)
    packet = encode_quantized_activation(x, 4, 196)
    coded = encode(packet, coding)
    assert len(coded) < len(packet) / 2
    assert decode(coded, coding, max_bytes=len(packet)) == packet
    decode_activation_array(decode(coded, coding, max_bytes=len(packet)))


@pytest.mark.parametrize("body", [
    pytest.param(b"\x50\x2a\x4d\x18" + (0xFFFFFFFF).to_bytes(4, "little"), id="skippable-4GiB"),
    pytest.param(b"\x50\x2a\x4d\x18" + (0).to_bytes(4, "little") + b"anything", id="skippable-empty"),
])
def test_skippable_frames_are_refused_before_anything_is_allocated(body):
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(WireFormatError, match="magic number"):
            zstd_decompress(body, max_bytes=1000)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


def test_an_empty_frame_with_bytes_behind_it_is_refused():
    assert zstd_decompress(zstd_compress(b""), max_bytes=0) == b""
    for extra in (b"garbage", zstd_compress(b"x" * 500), zstd_compress(b"x" * 5000)):
        with pytest.raises(WireFormatError, match="follow the end") as refused:
            zstd_decompress(zstd_compress(b"") + extra, max_bytes=1000)
        assert type(refused.value) is WireFormatError  # a 400: the frame itself holds nothing


def test_a_frame_declaring_nothing_whose_block_holds_100_kb_is_refused():
    n = 100_000  # one raw block (RFC 8878 3.1.1.2): last-block bit, type 0, size
    frame = ZSTD_MAGIC + bytes([0x20, 0x00]) + (1 | n << 3).to_bytes(3, "little") + b"x" * n
    assert zstandard.frame_content_size(frame) == 0
    with pytest.raises(WireFormatError, match="not a valid"):
        zstd_decompress(frame, max_bytes=1000)


@pytest.mark.parametrize("name", ["br", "gzip", "", "DEFLATE"])
def test_an_unknown_coding_is_a_wire_format_error_naming_the_known_ones(name):
    with pytest.raises(WireFormatError, match="deflate, zstd"):
        decode(b"x", name, max_bytes=10)
    with pytest.raises(WireFormatError, match="unknown content coding"):
        encode(b"x", name)
