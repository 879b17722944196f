"""ONNX segments for the kernels' tests of the check (built with onnx's helper)."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qpart.kernels.onnx_segment import (
    INPUT_NAME,
    ONNX_OPSET,
    ONNX_SEGMENT_FORMAT,
    ONNX_SEGMENT_FORMAT_VERSION,
    OUTPUT_NAME,
    OnnxSegmentInfo,
    OnnxSegmentLimits,
    check_onnx_segment,
)


def segment_model(nodes=None, initializers=None, opsets=(("", ONNX_OPSET),),
                  producer=ONNX_SEGMENT_FORMAT) -> onnx.ModelProto:
    """A segment of ``nodes`` (one Add by default) over ``input`` [N, 4]."""
    nodes = nodes if nodes is not None else [helper.make_node("Add", [INPUT_NAME, "w"], [OUTPUT_NAME])]
    initializers = initializers if initializers is not None else [
        numpy_helper.from_array(np.ones(4, np.float32), "w")]
    graph = helper.make_graph(
        nodes, "", [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets],
                              ir_version=8, producer_name=producer,
                              producer_version=ONNX_SEGMENT_FORMAT_VERSION)
    helper.set_model_props(model, {"model": "m", "version": "v", "cut": "1", "pattern_id": "c1-x"})
    return model


def with_digest(model: onnx.ModelProto) -> tuple[bytes, str]:
    data = model.SerializeToString()
    return data, hashlib.sha256(data).hexdigest()


def segment(nodes, initializers, input_shape=("N", 4), opset=ONNX_OPSET) -> bytes:
    """A segment's bytes: ``nodes`` over ``input`` of ``input_shape``."""
    graph = helper.make_graph(
        nodes, "", [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8,
                              producer_name=ONNX_SEGMENT_FORMAT, producer_version=ONNX_SEGMENT_FORMAT_VERSION)
    helper.set_model_props(model, {"model": "m", "version": "v", "cut": "1", "pattern_id": "c1-x"})
    return model.SerializeToString()


def check(data: bytes, limits: OnnxSegmentLimits | None = None) -> OnnxSegmentInfo:
    return check_onnx_segment(data, hashlib.sha256(data).hexdigest(), limits=limits)



def window_bomb(metadata: dict[str, str] | None = None, doublings: int = 12, window: int = 2048,
                op: str = "AveragePool") -> bytes:
    """Issue 52's hostile segment, about 1 KB within every memory cap: ``input`` [N, 1, 1, 1]
    doubled by ``Concat`` ``doublings`` times along each spatial axis (to [N, 1, 4096, 4096], 2**24
    elements: the tensor cap), then one ``op`` (``AveragePool``, ``MaxPool``, or ``Conv`` with a
    weight ``Expand``-ed from one float) of ``window`` x ``window`` at stride 1: 2049**2 outputs of
    2048**2 reads each, about 1.8e13 operations per sample."""
    nodes, prev = [], INPUT_NAME
    for axis in (3, 2):
        for i in range(doublings):
            nodes.append(helper.make_node("Concat", [prev, prev], [f"x{axis}_{i}"], axis=axis))
            prev = f"x{axis}_{i}"
    inits = []
    if op == "Conv":
        inits = [numpy_helper.from_array(np.ones(1, np.float32), "one"),
                 numpy_helper.from_array(np.array([1, 1, window, window], np.int64), "shape")]
        nodes += [helper.make_node("Expand", ["one", "shape"], ["w"]),
                  helper.make_node("Conv", [prev, "w"], [OUTPUT_NAME])]
    else:
        nodes.append(helper.make_node(op, [prev], [OUTPUT_NAME], kernel_shape=[window, window]))
    graph = helper.make_graph(
        nodes, "", [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", 1, 1, 1])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)], ir_version=8,
                              producer_name=ONNX_SEGMENT_FORMAT, producer_version=ONNX_SEGMENT_FORMAT_VERSION)
    helper.set_model_props(model, metadata or {"model": "m", "version": "v", "cut": "1",
                                               "pattern_id": "c1-x"})
    return model.SerializeToString()
