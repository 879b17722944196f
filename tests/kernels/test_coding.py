"""The deflate content coding: round trips, and bytes from the network never crash or balloon."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.coding import deflate, inflate
from kernels.errors import OversizeError, TruncatedError, WireFormatError
from kernels.wire import decode_activation_array, encode_quantized_activation


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=4096))
def test_round_trip(data):
    assert inflate(deflate(data), max_bytes=len(data)) == data


@settings(max_examples=1000, deadline=None)
@given(data=st.binary(max_size=512), limit=st.integers(0, 4096))
def test_garbage_is_refused_with_a_typed_error_and_never_exceeds_the_limit(data, limit):
    try:
        out = inflate(data, max_bytes=limit)
    except WireFormatError:  # TruncatedError and OversizeError are WireFormatErrors too
        return
    assert len(out) <= limit


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=1, max_size=2048), cut=st.integers(0, 10_000), flip=st.integers(0, 255))
def test_damaged_streams_are_refused_or_decode_within_the_limit(data, cut, flip):
    stream = bytearray(deflate(data))
    stream[cut % len(stream)] ^= flip or 1
    try:
        out = inflate(bytes(stream), max_bytes=len(data))
    except WireFormatError:
        return
    assert out == data  # a damaged stream that still inflates passed zlib's checksum


def test_a_small_bomb_is_cut_off_at_the_limit():
    bomb = zlib.compress(b"\0" * 50_000_000, 9)
    assert len(bomb) < 60_000
    with pytest.raises(OversizeError, match="more than 1000000 bytes"):
        inflate(bomb, max_bytes=1_000_000)


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_the_limit_is_exact(n):
    assert inflate(deflate(b"x" * n), max_bytes=n) == b"x" * n
    with pytest.raises(OversizeError):
        inflate(deflate(b"x" * (n + 1)), max_bytes=n)


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


def test_a_packet_survives_the_coding_and_shrinks_where_activations_are_sparse():
    x = np.zeros((1, 1, 28, 28), dtype=np.float32)
    x[0, 0, 8:20, 8:20] = np.random.default_rng(0).random((12, 12), dtype=np.float32)
    packet = encode_quantized_activation(x, 4, 196)
    coded = deflate(packet)
    assert len(coded) < len(packet) / 2
    assert inflate(coded, max_bytes=len(packet)) == packet
    decode_activation_array(inflate(coded, max_bytes=len(packet)))
