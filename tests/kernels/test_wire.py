"""Wire formats: round trips, and typed errors (never a crash) on hostile bytes."""

import contextlib
import json
import struct

import numpy as np
import pytest
import safetensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qpart.kernels import (
    KernelError,
    OversizeError,
    QuantScheme,
    TruncatedError,
    WireFormatError,
    quantize_pack,
    unpack_dequantize,
)
from qpart.kernels.segment_format import SegmentHeader, decode_segment, encode_segment
from qpart.kernels.wire import (
    decode_activation,
    decode_activation_array,
    encode_activation,
    encode_float_activation,
    encode_quantized_activation,
)


def _activation(shape=(2, 3, 5), bits=3, group=7):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    return x, quantize_pack(x, QuantScheme(bits, group))


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), bits=st.integers(1, 8),
       group=st.integers(1, 300), seed=st.integers(0, 2**16), scale=st.sampled_from([1e-3, 1.0, 1e4]))
def test_the_one_buffer_encoder_writes_the_composed_packet_byte_for_byte(shape, bits, group, seed, scale):
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    composed = encode_activation(quantize_pack(x, QuantScheme(bits, group)))
    assert encode_quantized_activation(x, bits, group) == composed


def test_the_one_buffer_encoder_refuses_what_the_composed_one_refuses():
    with pytest.raises(WireFormatError):
        encode_quantized_activation(np.zeros((1,) * 9, np.float32), 4, 8)
    for bits, group in ((0, 8), (9, 8), (4, 0)):
        with pytest.raises(KernelError):
            encode_quantized_activation(np.zeros(8, np.float32), bits, group)
    with pytest.raises(KernelError):
        encode_quantized_activation(np.zeros(0, np.float32), 4, 8)
    with pytest.raises(KernelError):
        encode_quantized_activation(np.array([0.0, np.nan, 1.0], np.float32), 4, 8)


def test_activation_packet_round_trips():
    _x, packed = _activation()
    back = decode_activation(encode_activation(packed))
    assert back.shape == (2, 3, 5) and back.scheme == QuantScheme(3, 7)
    np.testing.assert_array_equal(unpack_dequantize(back), unpack_dequantize(packed))


def test_activation_header_is_little_endian_and_pinned():
    _, packed = _activation(shape=(9,), bits=4, group=256)
    raw = encode_activation(packed)
    assert raw[:4] == b"QPA\x01" and raw[4] == 4 and raw[5] == 1
    assert struct.unpack_from("<I", raw, 8)[0] == 256 and struct.unpack_from("<I", raw, 12)[0] == 9
    assert len(raw) == 16 + 8 + 8


def test_truncated_activation_is_a_typed_error():
    _, packed = _activation()
    raw = encode_activation(packed)
    for cut in (0, 3, 11, 20, len(raw) - 1):
        with pytest.raises(TruncatedError):
            decode_activation(raw[:cut])


def test_activation_with_huge_declared_shape_is_refused_before_allocating():
    raw = struct.pack("<4sBBHI", b"QPA\x01", 8, 2, 0, 1) + struct.pack("<2I", 2**31, 2**31)
    with pytest.raises(OversizeError):
        decode_activation(raw)


def test_activation_with_non_positive_scale_is_refused():
    _, packed = _activation(shape=(4,), bits=2, group=4)
    raw = bytearray(encode_activation(packed))
    raw[16:20] = struct.pack("<f", 0.0)
    with pytest.raises(WireFormatError, match="positive"):
        decode_activation(bytes(raw))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_fuzz_activation_parser_raises_only_typed_errors(data):
    with contextlib.suppress(WireFormatError):
        decode_activation(data)


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_fuzz_mutated_activation_packets(data):
    _, packed = _activation()
    raw = bytearray(encode_activation(packed))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(0, len(raw) + 2))]
    with contextlib.suppress(WireFormatError):
        decode_activation(bytes(raw))


def _segment():
    w = np.random.default_rng(2).standard_normal((8, 3, 3, 3)).astype(np.float32)
    quant = {"conv.weight": quantize_pack(w, QuantScheme(3, 27))}
    floats = {"conv.bias": np.arange(8, dtype=np.float32)}
    return encode_segment(SegmentHeader("m", "1", 2, "p-1"), quant, floats), quant


def test_segment_round_trips_with_metadata():
    raw, quant = _segment()
    seg = decode_segment(raw)
    assert seg.header == SegmentHeader("m", "1", 2, "p-1")
    np.testing.assert_array_equal(seg.quantized["conv.weight"].data, quant["conv.weight"].data)
    np.testing.assert_array_equal(seg.floats["conv.bias"], np.arange(8, dtype=np.float32))


def test_segment_with_a_flipped_data_byte_fails_its_content_hash():
    raw = bytearray(_segment()[0])
    raw[-1] ^= 0x01
    with pytest.raises(WireFormatError, match="content_sha256"):
        decode_segment(bytes(raw))


def test_segment_over_the_size_limit_is_refused():
    raw, _ = _segment()
    with pytest.raises(OversizeError):
        decode_segment(raw, max_bytes=len(raw) - 1)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_mutated_segments_raise_only_typed_errors(data):
    raw = bytearray(_segment()[0])
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(0, len(raw)))]
    with contextlib.suppress(WireFormatError):
        decode_segment(bytes(raw))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_as_segment(data):
    with contextlib.suppress(WireFormatError):
        decode_segment(data)


def test_float_activation_packet_round_trips():
    x = np.random.default_rng(3).standard_normal((2, 5)).astype(np.float32)
    arr, bits, group = decode_activation_array(encode_float_activation(x))
    assert bits == 32 and group == 0
    np.testing.assert_array_equal(arr, x)


def test_quantized_packet_decodes_to_floats_too():
    x, packed = _activation()
    arr, bits, group = decode_activation_array(encode_activation(packed))
    assert (bits, group) == (3, 7) and arr.shape == x.shape


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_float_packet_parser(data):
    with contextlib.suppress(WireFormatError):
        decode_activation_array(b"QPA\x01\x20" + data)


def test_segment_encoding_is_byte_stable():
    # Content addressing: the same content must give the same bytes in every build.
    w = np.random.default_rng(5).standard_normal((4, 9)).astype(np.float32)
    quant = {f"t{i}.weight": quantize_pack(w * i, QuantScheme(4, 9)) for i in range(1, 6)}
    floats = {f"t{i}.bias": np.arange(4, dtype=np.float32) * i for i in range(1, 6)}
    header = SegmentHeader("m", "v", 3, "p")
    first = encode_segment(header, quant, floats)
    assert all(encode_segment(header, dict(reversed(quant.items())), floats) == first for _ in range(5))
    assert safetensors.deserialize(first)  # the library's own parser accepts it


def _activation_header(bits, dims, group):
    return struct.pack("<4sBBHI", b"QPA\x01", bits, len(dims), 0, group) + struct.pack(
        f"<{len(dims)}I", *dims)


def test_a_group_larger_than_the_packet_is_refused_before_any_allocation():
    raw = _activation_header(2, [4], 2**32 - 1) + bytes(8 + 1)
    with pytest.raises(WireFormatError, match="group_size"):
        decode_activation(raw)


def test_float_packet_dims_that_overflow_int64_are_a_typed_error():
    with pytest.raises(WireFormatError):
        decode_activation_array(struct.pack("<4sBBHI", b"QPA\x01", 32, 4, 0, 0)
                                + struct.pack("<4I", 65536, 65536, 65536, 65536))


def _segment_with_descriptors(descriptors):
    from qpart.kernels.segment_format import _content_digest, _serialize

    arrays = {"t.codes": np.zeros(3, np.uint8), "t.scales": np.ones(1, np.float32),
              "t.mins": np.zeros(1, np.float32)}
    meta = {"format": "qpart-segment", "format_version": "1", "model": "m", "version": "v", "cut": "1",
            "pattern_id": "p", "tensors": json.dumps(descriptors) if not isinstance(descriptors, str)
            else descriptors}
    meta["content_sha256"] = _content_digest(descriptors if not isinstance(descriptors, str) else [],
                                             arrays)
    return _serialize(arrays, meta)


@pytest.mark.parametrize("shape", [[274177, 67280421310721], [2**62, 4], [-1, 3], [1.5], [True]])
def test_hostile_segment_shapes_are_typed_errors(shape):
    raw = _segment_with_descriptors([{"name": "t", "kind": "quant", "shape": shape, "bits": 3,
                                      "group_size": 1}])
    with pytest.raises(WireFormatError):
        decode_segment(raw)


def test_infinite_shape_and_deep_nesting_in_metadata_are_typed_errors():
    for text in ('[{"name": "t", "kind": "quant", "shape": [Infinity], "bits": 3, "group_size": 1}]',
                 "[" * 100_000):
        with pytest.raises(WireFormatError):
            decode_segment(_segment_with_descriptors(text))


def test_segment_group_larger_than_the_tensor_is_refused():
    raw = _segment_with_descriptors([{"name": "t", "kind": "quant", "shape": [8], "bits": 3,
                                      "group_size": 2**40}])
    with pytest.raises(WireFormatError, match="group_size"):
        decode_segment(raw)


_SCALARS = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=5)
_JSON = st.recursive(_SCALARS,
                     lambda children: st.lists(children, max_size=4)
                     | st.dictionaries(st.sampled_from(["name", "kind", "shape", "bits", "group_size", "x"]),
                                       children, max_size=5), max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.fixed_dictionaries(
    {"name": st.sampled_from(["t", "u"]), "kind": st.sampled_from(["quant", "fp32", "fp16", "zz"]),
     "shape": st.lists(st.integers(-3, 2**40), max_size=3) | _JSON,
     "bits": st.integers(-1, 10) | _JSON, "group_size": st.integers(-1, 2**41) | _JSON}), max_size=3))
def test_fuzz_structured_descriptors_raise_only_typed_errors(descriptors):
    try:
        raw = _segment_with_descriptors(descriptors)
    except (ValueError, TypeError):  # not serialisable JSON (NaN keys etc.): nothing to send
        return
    try:
        seg = decode_segment(raw)
    except WireFormatError:
        return
    for packed in seg.quantized.values():  # whatever decodes must also dequantize
        unpack_dequantize(packed)


def test_float_packet_bytes_is_the_encoded_size():
    from qpart.kernels.wire import float_packet_bytes

    for shape in [(1,), (3, 1, 28, 28), (2, 5)]:
        assert float_packet_bytes(shape) == len(encode_float_activation(np.zeros(shape, np.float32)))
