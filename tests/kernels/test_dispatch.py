"""The native kernels at every instruction-set level this CPU runs (ADR 0026): each level gives the
numpy reference's bytes, bit for bit, and a level is chosen, named and refused as documented."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qpart.kernels import (
    Backend,
    KernelError,
    QuantizationError,
    QuantScheme,
    native_isa,
    native_isa_used,
    pack_codes,
    quantize_pack,
    unpack_codes,
    unpack_dequantize,
)
from qpart.kernels.ops import native_module

NATIVE = native_module()
pytestmark = pytest.mark.skipif(NATIVE is None, reason="native extension not built")
LEVELS = NATIVE.isas() if NATIVE is not None else []
FINITE = st.floats(-(2.0**100), 2.0**100, allow_nan=False, width=32)


def _every_output(x, bits, group, backend):
    scheme = QuantScheme(bits, group)
    packed = quantize_pack(x, scheme, backend=backend)
    codes = unpack_codes(packed.data, bits, x.size, backend=backend)
    return (packed.data, packed.scales, packed.mins, unpack_dequantize(packed, backend=backend), codes,
            pack_codes(codes, bits, backend=backend))


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=150, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(1, 20000), elements=FINITE), bits=st.integers(1, 8),
       group=st.integers(1, 5000))
def test_each_level_gives_the_references_bytes(level, x, bits, group):
    # up to 20,000 values: full 4,096-code blocks and a tail, groups across block edges
    reference = _every_output(x, bits, group, Backend.NUMPY)
    with native_isa_used(level):
        native = _every_output(x, bits, group, Backend.NATIVE)
    for ours, theirs in zip(native, reference, strict=True):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("level", LEVELS)
def test_each_level_refuses_what_the_baseline_refuses(level):
    x = np.ones(5000, np.float32)
    x[4999] = np.nan  # in the tail, after the vector loops' full blocks
    with native_isa_used(level), pytest.raises(QuantizationError, match="NaN or infinity"):
        quantize_pack(x, QuantScheme(4, 64), backend=Backend.NATIVE)


def test_the_widest_level_runs_by_default_and_the_baseline_is_always_there():
    assert LEVELS[-1] == "baseline"
    if os.environ.get("QPART_KERNELS_ISA", "auto") == "auto":
        assert native_isa() == LEVELS[0]
    before = native_isa()
    with (pytest.raises(KernelError, match="no avx9000 kernels in this build; this machine runs: "),
          native_isa_used("avx9000")):
        pass
    assert native_isa() == before  # unchanged by the refusal


def _isa_in_subprocess(value):
    env = {**os.environ, "QPART_KERNELS_ISA": value, "QPART_KERNELS": "auto"}
    return subprocess.run([sys.executable, "-c", "import qpart.kernels as k; print(k.native_isa())"],
                          env=env, capture_output=True, text=True, check=False)


def test_the_level_is_named_by_its_variable():
    done = _isa_in_subprocess("Baseline")  # in any case, as QPART_KERNELS
    assert done.returncode == 0 and done.stdout.strip() == "baseline"
    bad = _isa_in_subprocess("avx9000")
    assert bad.returncode != 0
    expected = "QPART_KERNELS_ISA=avx9000: no avx9000 kernels in this build; this machine runs: "
    assert expected + ", ".join(LEVELS) in bad.stderr


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("offset", [0, 1])
def test_a_large_output_streamed_to_memory_holds_the_references_values(level, offset):
    # 2^21 values and more go out with streaming stores; offset 1: an output 4 bytes past a
    # 16-byte boundary, whose head and tail are written one float at a time
    n = (1 << 21) + 1237
    x = np.random.default_rng(offset).standard_normal(n).astype(np.float32)
    packed = quantize_pack(x, QuantScheme(3, 256), backend=Backend.NUMPY)
    reference = unpack_dequantize(packed, backend=Backend.NUMPY)
    buffer = np.full(n + offset + 16, np.nan, np.float32)
    with native_isa_used(level):
        unpack_dequantize(packed, out=buffer[offset : offset + n], backend=Backend.NATIVE)
    np.testing.assert_array_equal(buffer[offset : offset + n], reference)
    assert np.isnan(buffer[:offset]).all() and np.isnan(buffer[offset + n :]).all()  # nothing around it
