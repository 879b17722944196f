"""The device's ONNX segment checker on mutated segments: it returns or refuses with a kernels
error, never anything else (it reads bytes from the network before ONNX Runtime does); and what it
passes, protobuf reads as the same model (the same operators and domains, no functions, no external
data): no parser differential."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qpart.kernels.errors import KernelError, WireFormatError
from qpart.kernels.onnx_segment import (
    INPUT_NAME,
    ONNX_OPSET,
    ONNX_SEGMENT_FORMAT,
    ONNX_SEGMENT_FORMAT_VERSION,
    OUTPUT_NAME,
    check_onnx_segment,
)
from tests.kernels.protobuf_records import varint

CASES = 3000


def _segment() -> bytes:
    """A small head of the shapes the exporter writes: conv, relu, pool, flatten, gemm."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "w0"),
             numpy_helper.from_array(np.zeros(4, np.float32), "b0"),
             numpy_helper.from_array(rng.standard_normal((10, 64)).astype(np.float32), "w1"),
             numpy_helper.from_array(np.arange(16, dtype=np.uint8), "codes")]
    nodes = [helper.make_node("Conv", [INPUT_NAME, "w0", "b0"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w1"], [OUTPUT_NAME], transB=1)]
    graph = helper.make_graph(
        nodes, "", [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)], ir_version=8,
                              producer_name=ONNX_SEGMENT_FORMAT, producer_version=ONNX_SEGMENT_FORMAT_VERSION)
    helper.set_model_props(model, {"model": "m", "version": "v", "cut": "3", "pattern_id": "c3-x"})
    return model.SerializeToString()


def _mutate(data: bytes, rng: np.random.Generator) -> bytes:
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 6))):
        kind = int(rng.integers(0, 5))
        at = int(rng.integers(0, len(buf))) if buf else 0
        if kind == 0 and buf:  # flip a byte
            buf[at] ^= int(rng.integers(1, 256))
        elif kind == 1:  # truncate
            del buf[at:]
        elif kind == 2:  # insert random bytes
            buf[at:at] = rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8).tobytes()
        elif kind == 3:  # a huge varint length
            buf[at:at] = b"\x0a\xff\xff\xff\xff\x0f"
        else:  # splice a piece of the segment elsewhere (nested messages inside messages)
            start = int(rng.integers(0, len(data)))
            buf[at:at] = data[start:start + int(rng.integers(1, 64))]
    return bytes(buf)


def test_the_unmutated_segment_passes():
    data = _segment()
    assert check_onnx_segment(data, hashlib.sha256(data).hexdigest()).nodes == 5


@pytest.mark.parametrize("seed", range(3))
def test_mutated_segments_pass_or_are_refused_with_a_kernels_error(seed):
    rng = np.random.default_rng(seed)
    original = _segment()
    outcomes = {"passed": 0, "refused": 0}
    for _ in range(CASES):
        data = _mutate(original, rng)
        try:
            check_onnx_segment(data, hashlib.sha256(data).hexdigest(), size_bytes=len(data))
        except KernelError as exc:
            assert str(exc) and "\n" not in str(exc)
            outcomes["refused"] += 1
        else:
            outcomes["passed"] += 1
    assert outcomes["refused"] > CASES // 2  # the mutations do reach the checks



# Records a differential would hide behind: a tag over 32 bits, a fixed32 op_type, a second op_type
# or domain, a custom domain, an external-data location, a local function.
_SPOOFS = [varint(1 << 32 | 4 << 3 | 2) + b"\x03Sin", varint(4 << 3 | 5) + b"Relu",
           b"\x22\x04Relu", b"\x3a\x0dcom.microsoft", b"\x3a\x00\x3a\x00", varint(14 << 3) + b"\x01",
           b"\x6a\x00", b"\xca\x01\x00", varint(1 << 35 | 7 << 3 | 2) + b"\x00"]


def _mutate_records(data: bytes, rng: np.random.Generator) -> bytes:
    """The structural mutations of :func:`_mutate` plus spoofed records spliced in anywhere."""
    buf = bytearray(_mutate(data, rng) if rng.integers(0, 2) else data)
    for _ in range(int(rng.integers(1, 3))):
        at = int(rng.integers(0, len(buf) + 1))
        buf[at:at] = _SPOOFS[int(rng.integers(0, len(_SPOOFS)))]
    return bytes(buf)


def _protobuf_view(data: bytes) -> tuple[list[tuple[str, str]], list[str], int, list[str]]:
    model = onnx.load_from_string(data)
    locations = [e.value for t in model.graph.initializer for e in t.external_data]
    locations += [t.name for t in model.graph.initializer if t.data_location != TensorProto.DEFAULT]
    return ([(n.op_type, n.domain) for n in model.graph.node], [o.domain for o in model.opset_import],
            len(model.functions), locations)


@pytest.mark.parametrize("seed", range(2))
def test_what_the_check_passes_protobuf_reads_as_the_same_model(seed):
    rng = np.random.default_rng(100 + seed)
    original = _segment()
    passed = 0
    for case in range(CASES):
        data = _mutate(original, rng) if case % 2 else _mutate_records(original, rng)
        try:
            info = check_onnx_segment(data, hashlib.sha256(data).hexdigest())
        except KernelError:
            continue
        passed += 1
        node_ops, domains, functions, locations = _protobuf_view(data)
        assert node_ops == list(info.node_ops) and domains == list(info.opset_domains), data.hex()
        assert functions == 0 and locations == [], data.hex()
        assert all(op in info.ops for op, _ in node_ops)
    assert passed  # some mutations land in places the check allows (names, raw data)


@pytest.mark.parametrize("spoof", _SPOOFS)
def test_a_spoofed_record_in_a_node_is_refused(spoof):
    original = _segment()
    model = onnx.load_from_string(original)
    node = model.graph.node[1].SerializeToString()  # Relu
    record = b"\x0a" + varint(len(node)) + node
    graph = model.graph.SerializeToString()
    new_node = node + spoof
    new_graph = graph.replace(record, b"\x0a" + varint(len(new_node)) + new_node)
    g_record = b"\x3a" + varint(len(graph)) + graph
    data = original.replace(g_record, b"\x3a" + varint(len(new_graph)) + new_graph)
    assert data != original
    with pytest.raises(WireFormatError):
        check_onnx_segment(data, hashlib.sha256(data).hexdigest())
