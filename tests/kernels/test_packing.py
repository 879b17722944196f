"""Packing layout: pinned test vectors, round trips, sizes and rejected codes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qpart.kernels import Backend, QuantizationError, pack_codes, packed_size, unpack_codes
from qpart.kernels.ops import native_module

BACKENDS = [Backend.NUMPY] + ([Backend.NATIVE] if native_module() is not None else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_pack_pins_the_documented_layout_for_3_bits(backend):
    # 8 codes -> one column (M = 1): word = c0 | c1<<3 | ... | c7<<21, stored as 3 bytes.
    codes = np.array([1, 2, 3, 4, 5, 6, 7, 0], dtype=np.uint8)
    word = sum(int(c) << (3 * r) for r, c in enumerate(codes))
    assert pack_codes(codes, 3, backend=backend).tolist() == list(word.to_bytes(3, "little"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_pack_pins_the_column_major_block_for_2_bits(backend):
    # 16 codes -> M = 2 columns: column m holds codes m, 2+m, 4+m, ..., 14+m.
    codes = np.arange(16, dtype=np.uint8) % 4
    packed = pack_codes(codes, 2, backend=backend)
    expect = []
    for t in range(2):
        for m in range(2):
            word = sum(int(codes[r * 2 + m]) << (2 * r) for r in range(8))
            expect.append((word >> (8 * t)) & 0xFF)
    assert packed.tolist() == expect


@pytest.mark.parametrize("backend", BACKENDS)
def test_pack_pads_the_tail_with_zero_codes(backend):
    packed = pack_codes(np.array([1], dtype=np.uint8), 4, backend=backend)
    assert packed.tolist() == [1, 0, 0, 0]
    assert packed_size(1, 4) == 4 and packed_size(8, 4) == 4 and packed_size(9, 4) == 8


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [1, 7, 8, 9, 4095, 4096, 4097, 12_289])
def test_unpack_inverts_pack(backend, bits, n):
    codes = np.random.default_rng(n * 10 + bits).integers(0, 1 << bits, n, dtype=np.uint8)
    packed = pack_codes(codes, bits, backend=backend)
    assert packed.size == packed_size(n, bits)
    np.testing.assert_array_equal(unpack_codes(packed, bits, n, backend=backend), codes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pack_rejects_a_code_wider_than_bits(backend):
    with pytest.raises(QuantizationError, match="does not fit in 3 bits"):
        pack_codes(np.array([0, 8], dtype=np.uint8), 3, backend=backend)


@pytest.mark.parametrize("bits", [0, 9, -1])
def test_pack_rejects_bits_outside_1_to_8(bits):
    with pytest.raises(QuantizationError, match=r"1\.\.8"):
        pack_codes(np.zeros(4, dtype=np.uint8), bits)


def test_unpack_rejects_a_buffer_of_the_wrong_size():
    with pytest.raises(QuantizationError, match="expected 3"):
        unpack_codes(np.zeros(4, dtype=np.uint8), 3, 8)


@settings(max_examples=200, deadline=None)
@given(bits=st.integers(1, 8), data=st.data())
def test_round_trip_property(bits, data):
    codes = np.array(data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=0, max_size=9000)),
                     dtype=np.uint8)
    for backend in BACKENDS:
        packed = pack_codes(codes, bits, backend=backend)
        np.testing.assert_array_equal(unpack_codes(packed, bits, codes.size, backend=backend), codes)


def _reference_block(codes, bits, m):
    """Straight from the docstring: column m's 8 codes form a little-endian word; byte t at t*M+m."""
    out = bytearray(bits * m)
    for col in range(m):
        word = sum(int(codes[r * m + col]) << (r * bits) for r in range(8))
        for t in range(bits):
            out[t * m + col] = (word >> (8 * t)) & 0xFF
    return bytes(out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bits", [1, 3, 5, 7])
def test_a_full_512_column_block_and_a_tail_match_the_definition(backend, bits):
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, 4096 + 20, dtype=np.uint8)
    expected = _reference_block(codes[:4096], bits, 512) + _reference_block(
        np.concatenate([codes[4096:], np.zeros(4, np.uint8)]), bits, 3)
    assert pack_codes(codes, bits, backend=backend).tobytes() == expected


@settings(max_examples=100, deadline=None)
@given(bits=st.integers(1, 8), n=st.integers(0, 20000), seed=st.integers(0, 2**32 - 1))
def test_native_pack_equals_numpy_pack(bits, n, seed):
    if native_module() is None:
        pytest.skip("native extension not built")
    codes = np.random.default_rng(seed).integers(0, 1 << bits, n, dtype=np.uint8)
    assert (pack_codes(codes, bits, backend=Backend.NATIVE).tobytes()
            == pack_codes(codes, bits, backend=Backend.NUMPY).tobytes())
