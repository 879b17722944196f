"""Quantization: the error bound, degenerate groups, rejected input, and native/numpy parity."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qpart.kernels import (
    Backend,
    QuantizationError,
    QuantScheme,
    quantize_pack,
    unpack_dequantize,
    weight_group_size,
)
from qpart.kernels.ops import PackedTensor, active_backend, native_module
from qpart.kernels.quantization import dequantize_numpy, quantize_numpy

BACKENDS = [Backend.NUMPY] + ([Backend.NATIVE] if native_module() is not None else [])
FINITE = st.floats(-(2.0**100), 2.0**100, allow_nan=False, width=32)


def _bound_holds(x, packed, y):
    scales = np.repeat(packed.scales, packed.scheme.group_size)[: x.size]
    err = np.abs(y.reshape(-1) - x.reshape(-1))
    # scale/2 from rounding to nearest, plus float32 rounding of (x - min) * inv and code * s + min.
    slack = 4 * np.finfo(np.float32).eps * (np.abs(x.reshape(-1)) + scales * (1 << packed.scheme.bits))
    return bool(np.all(err <= scales / 2 + slack))


@settings(max_examples=300, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(1, 3000), elements=FINITE),
       bits=st.integers(1, 8), group=st.integers(1, 600))
def test_error_is_at_most_half_a_step(x, bits, group):
    for backend in BACKENDS:
        packed = quantize_pack(x, QuantScheme(bits, group), backend=backend)
        y = unpack_dequantize(packed, backend=backend)
        assert y.shape == x.shape
        assert _bound_holds(x, packed, y)


@settings(max_examples=200, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(1, 9000), elements=FINITE),
       bits=st.integers(1, 8), group=st.integers(1, 700))
def test_native_and_numpy_agree_bit_for_bit(x, bits, group):
    if native_module() is None:
        pytest.skip("native extension not built")
    scheme = QuantScheme(bits, group)
    a = quantize_pack(x, scheme, backend=Backend.NATIVE)
    b = quantize_pack(x, scheme, backend=Backend.NUMPY)
    np.testing.assert_array_equal(a.data, b.data)
    np.testing.assert_array_equal(a.scales, b.scales)
    np.testing.assert_array_equal(a.mins, b.mins)
    np.testing.assert_array_equal(unpack_dequantize(a, backend=Backend.NATIVE),
                                  unpack_dequantize(a, backend=Backend.NUMPY))


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_group_round_trips_exactly(backend):
    x = np.full(300, 3.25, dtype=np.float32)
    packed = quantize_pack(x, QuantScheme(2, 256), backend=backend)
    np.testing.assert_array_equal(unpack_dequantize(packed, backend=backend), x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_rejected(backend, bad):
    x = np.zeros(1000, dtype=np.float32)
    x[517] = bad
    with pytest.raises(QuantizationError, match="NaN or infinity"):
        quantize_pack(x, QuantScheme(4, 256), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_range_overflow_is_rejected(backend):
    x = np.array([-3e38, 3e38], dtype=np.float32)
    with pytest.raises(QuantizationError):
        quantize_pack(x, QuantScheme(4, 2), backend=backend)


def test_empty_tensor_is_rejected():
    with pytest.raises(QuantizationError, match="empty"):
        quantize_pack(np.zeros(0, dtype=np.float32), QuantScheme(4, 8))


def test_scheme_rejects_bad_parameters():
    with pytest.raises(QuantizationError):
        QuantScheme(0, 8)
    with pytest.raises(QuantizationError):
        QuantScheme(4, 0)


def test_weight_group_is_one_output_channel():
    assert weight_group_size((64, 32, 3, 3)) == 288
    x = np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32)
    x[2] *= 100
    codes, scales, mins = quantize_numpy(x, QuantScheme(8, weight_group_size(x.shape)))
    assert scales.shape == (4,) and scales[2] > 50 * scales[0]
    assert np.abs(dequantize_numpy(codes, scales, mins, 10).reshape(4, 10) - x).max() < scales.max()


def test_native_extension_is_built_unless_numpy_is_forced():
    # CI runs the suite twice: once as installed (the extension must have been built by the
    # package build) and once with QPART_KERNELS=numpy.
    if os.environ.get("QPART_KERNELS", "auto") == "numpy":
        assert active_backend() is Backend.NUMPY
    else:
        assert native_module() is not None, "the package build did not produce kernels._native"
        assert active_backend() is Backend.NATIVE


@pytest.mark.parametrize("backend", BACKENDS)
def test_inconsistent_packed_tensors_are_typed_errors(backend):
    packed = quantize_pack(np.arange(12, dtype=np.float32), QuantScheme(4, 4), backend=backend)
    bad = PackedTensor(packed.shape, packed.scheme, np.ones(4, np.float32), packed.mins, packed.data)
    with pytest.raises(QuantizationError, match="inconsistent"):
        unpack_dequantize(bad, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_huge_group_is_one_group_without_a_huge_allocation(backend):
    x = np.arange(4, dtype=np.float32)
    packed = quantize_pack(x, QuantScheme(8, 2**62), backend=backend)
    assert packed.scales.shape == (1,)
    np.testing.assert_allclose(unpack_dequantize(packed, backend=backend), x, atol=0.01)


def test_signed_zeros_quantize_bit_identically():
    if native_module() is None:
        pytest.skip("native extension not built")
    x = np.array([0.0, -0.0, 1.0, -0.0] * 70, dtype=np.float32)
    x[:3] = [-0.0, 0.0, 0.0]
    for group in (2, 4, 280):
        a = quantize_pack(x, QuantScheme(3, group), backend=Backend.NATIVE)
        b = quantize_pack(x, QuantScheme(3, group), backend=Backend.NUMPY)
        assert a.mins.view(np.uint32).tolist() == b.mins.view(np.uint32).tolist()
        assert a.data.tobytes() == b.data.tobytes()
