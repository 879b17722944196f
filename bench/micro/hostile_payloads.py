"""What the hostile server of :mod:`bench.micro.hostile_device` sends: a gzip bomb, an ONNX work
bomb, text full of terminal escapes; and the device's one input image and its activation shape.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

ESCAPES = "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07\x1b[2J\rforged\nline\x9b\u202e"
"""An OSC 8 hyperlink, a CSI clear-screen, CR and LF (a forged line), a C1 CSI, a bidi override."""

BOMB_MIB = 1536
"""The gzip bomb's decoded size beyond the plan, in MiB (the issue's 1.5 MB answer)."""


def brotli_bomb(mib: int = 512) -> bytes:
    """``mib`` MiB of zeros in brotli (a few hundred bytes): a coding the device must refuse
    unread, since no brotli decoder it could use is bounded per step."""
    try:  # brotli comes with tritonclient's geventhttpclient; the device never decodes it
        import brotli  # type: ignore[import-untyped]
    except ImportError:  # the label alone must get it refused, whatever the bytes
        return b"\x1b" + b"\0" * 255
    return bytes(brotli.compress(b"\0" * (mib << 20), quality=5))


def gzip_bomb(prefix: bytes, mib: int = BOMB_MIB) -> bytes:
    """``prefix`` then ``mib`` MiB of spaces, gzip-coded in about ``mib`` KiB: each MiB is
    compressed once after a full flush (so every one codes the same) and the block repeated."""
    chunk = b" " * (1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(prefix)
    for _ in range(mib):
        crc = zlib.crc32(chunk, crc)
    size = (len(prefix) + mib * len(chunk)) & 0xFFFFFFFF
    gzip_header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return gzip_header + head + block * mib + c.flush() + struct.pack("<II", crc, size)


def work_bomb(metadata: dict[str, str], side_reps: int = 2, window: int = 1792) -> bytes:
    """An ONNX segment for ``metadata``'s plan (model, version, cut, pattern_id) that passes the
    operator allow-list and the element caps and asks for ``outputs x window²`` additions a sample:
    ``input`` ``[N, 1, 28, 28]`` joined with itself by Concats into a square of side
    ``28 x 64 x side_reps``, then one AveragePool with a ``window`` × ``window`` window at stride 1
    (issue 52, finding 2). The defaults: ``[N, 1, 3584, 3584]`` (12.8 M elements, under the 16.8 M
    cap) and about 1e13 operations, hours a sample, in under 1 KB."""
    from onnx import TensorProto, helper

    from qpart.kernels.onnx_segment import (
        INPUT_NAME,
        ONNX_IR_VERSION,
        ONNX_OPSET,
        ONNX_SEGMENT_FORMAT,
        ONNX_SEGMENT_FORMAT_VERSION,
        OUTPUT_NAME,
    )

    nodes = [helper.make_node("Concat", [INPUT_NAME] * 64, ["a"], axis=2),
             helper.make_node("Concat", ["a"] * side_reps, ["b"], axis=2),
             helper.make_node("Concat", ["b"] * 64, ["c"], axis=3),
             helper.make_node("Concat", ["c"] * side_reps, ["d"], axis=3),
             helper.make_node("AveragePool", ["d"], [OUTPUT_NAME], kernel_shape=[window, window],
                              strides=[1, 1])]
    graph = helper.make_graph(
        nodes, "", [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", 1, 28, 28])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              ir_version=ONNX_IR_VERSION, producer_name=ONNX_SEGMENT_FORMAT,
                              producer_version=ONNX_SEGMENT_FORMAT_VERSION)
    helper.set_model_props(model, metadata)
    data: bytes = model.SerializeToString()
    return data


def idx_file(path: Path) -> Path:
    """One 28 × 28 grayscale image as a raw IDX3 file (``qpart device infer --idx``): the device
    then plans for its input as is, with no image of its own to offer."""
    image = (np.arange(28 * 28, dtype=np.uint32) * 7 % 256).astype(np.uint8)
    path.write_bytes(struct.pack(">IIII", 0x803, 1, 28, 28) + image.tobytes())
    return path


def activation_shape(model: str, cut: int) -> list[int]:
    """One sample's activation shape at ``cut``: the head built from the model's code, run on
    zeros (the plan carries it; the pattern listing does not)."""
    import torch

    from qpart.models.partition import cuts_of, prepare, split
    from qpart.models.registry import get_model

    spec = get_model(model)
    gm = prepare(spec.build(), spec.input_shape)
    head, _ = split(gm, cuts_of(gm)[cut])
    with torch.no_grad():
        return list(head(torch.zeros(1, *spec.input_shape)).shape[1:])
