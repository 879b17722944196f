"""A file that is a well-formed ONNX segment to protobuf and an ORT-format model to ONNX Runtime.

ONNX Runtime, given model bytes whose 4..7 are b"ORTM", reads them as its flatbuffer format. The
file starts ``08 08`` (ir_version 8), ``b2 00`` (the tag of doc_string in an overlong two-byte
form), ``4f`` (its length, 79: the 'O'), then ``RTM...``: to flatbuffers, bytes 0..3 are the root
table's offset, 0x00B20808 (about 11.7 MB), and bytes 4..7 its identifier. The ORT-format model
(``inner``, saved by ONNX Runtime) lies there, at the end of an initializer's raw_data, behind a
copy of its root table moved to that offset (flatbuffers keep scalars aligned to 8 bytes).
"""

from __future__ import annotations

import struct
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from qpart.kernels.onnx_segment import ONNX_SEGMENT_FORMAT, ONNX_SEGMENT_FORMAT_VERSION
from tests.kernels.protobuf_records import record, varint


def ort_format_model(path: Path, nodes: list[onnx.NodeProto]) -> bytes:
    """``nodes`` (``input`` ``[N, 4]`` to ``activation``) saved by ONNX Runtime in its own format."""
    import onnxruntime as ort

    graph = helper.make_graph(nodes, "inner",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("activation", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(path)  # a .ort path: ONNX Runtime saves its own format
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return path.read_bytes()


def _relocated(inner: bytes, at: int) -> bytes:
    """Bytes to put at offset ``at``: a copy of the root table, then ``inner`` (8-aligned)."""
    root = struct.unpack_from("<I", inner, 0)[0]
    vtable = root - struct.unpack_from("<i", inner, root)[0]
    vtable_size, table_size = struct.unpack_from("<HH", inner, vtable)
    offsets = [struct.unpack_from("<H", inner, vtable + 4 + 2 * i)[0] for i in range((vtable_size - 4) // 2)]
    gap = (table_size + 7) // 8 * 8
    start = at + gap  # where inner begins
    table = bytearray(inner[root : root + table_size])
    struct.pack_into("<i", table, 0, at - (start + vtable))
    for off in (o for o in offsets if o):  # every field of the root table is an offset
        target = root + off + struct.unpack_from("<I", inner, root + off)[0]
        struct.pack_into("<I", table, off, (start + target) - (at + off))
    return bytes(table) + b"\0" * (gap - table_size) + inner


def _varint_record(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def polyglot(inner: bytes, metadata: dict[str, str]) -> bytes:
    """A segment whose protobuf view is one ``Add`` of a uint8 initializer, and whose ORT view is
    ``inner``."""
    assert inner[4:8] == b"ORTM"
    doc = b"RTM" + b"x" * 76
    head = b"\x08\x08" + b"\xb2\x00" + bytes([len(doc)]) + doc  # len(doc) == 79 == ord("O")
    at = struct.unpack("<I", head[:4])[0]
    moved = _relocated(inner, at)

    def value_info(name: bytes) -> bytes:
        return record(1, name) + record(2, record(1, _varint_record(1, TensorProto.FLOAT)))

    model = (head + record(2, ONNX_SEGMENT_FORMAT.encode()) + record(3, ONNX_SEGMENT_FORMAT_VERSION.encode())
             + record(8, record(1, b"") + _varint_record(2, 18))
             + b"".join(record(14, record(1, k.encode()) + record(2, v.encode()))
                        for k, v in metadata.items()))
    node = record(1, b"input") + record(1, b"w") + record(2, b"activation") + record(4, b"Add")
    graph = record(1, node) + record(11, value_info(b"input")) + record(12, value_info(b"activation"))
    pad = 0
    for _ in range(10):  # pad the raw_data until ``moved``, the file's tail, starts at ``at``
        raw = b"\0" * pad + moved
        tensor = (_varint_record(1, len(raw)) + _varint_record(2, TensorProto.UINT8) + record(8, b"w")
                  + record(9, raw))
        data = model + record(7, graph + record(5, tensor))
        start = len(data) - len(moved)
        if start == at:
            return data
        pad += at - start
    raise AssertionError("the polyglot's layout did not converge")
