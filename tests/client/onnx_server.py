"""A server answering in its place (an ``httpx.MockTransport``) with all-device ONNX plans for one
segment, and the ONNX heads the device tests of the work budget and the run deadline give it
(issue 52, finding 2)."""

from __future__ import annotations

import hashlib
import json

import httpx
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from qpart.client.onnx_runtime import OnnxDeviceRuntime
from qpart.client.settings import DeviceSettings
from qpart.client.transport import Transport
from qpart.kernels.onnx_segment import (
    INPUT_NAME,
    ONNX_OPSET,
    ONNX_SEGMENT_FORMAT,
    ONNX_SEGMENT_FORMAT_VERSION,
    OUTPUT_NAME,
)
from tests.client.samples import PLAN

MODEL, VERSION, CUT, PATTERN = "fmnist-cnn", "v1", 8, "c8-x"
METADATA = {"model": MODEL, "version": VERSION, "cut": str(CUT), "pattern_id": PATTERN}
"""What a segment of the plans below must carry."""


class Server:
    """Plans ``data`` as an all-device ONNX plan (nothing uploaded) declaring ``head_flops``
    (None: without the field, as servers before it), every time; counts what the device did."""

    def __init__(self, data: bytes, head_flops: int | None, activation_shape: list[int]) -> None:
        self.data, self.digest = data, hashlib.sha256(data).hexdigest()
        self.head_flops, self.activation_shape = head_flops, activation_shape
        self.held: list[list[str]] = []
        self.downloads = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/plan":
            self.held.append(json.loads(request.content)["held_segments"])
            segment = {"id": self.digest, "url": f"/v1/segments/{self.digest}", "size_bytes": len(self.data),
                       "sha256": self.digest, "held": self.digest in self.held[-1], "runtime": "onnx"}
            plan = {**PLAN, "plan_id": f"{MODEL}@{VERSION}/{PATTERN}", "cut": CUT, "cut_node": "_18",
                    "infer_url": None, "activation_shape": self.activation_shape, "segment": segment}
            if self.head_flops is not None:
                plan["head_flops"] = self.head_flops
            return httpx.Response(200, json=plan)
        self.downloads += 1
        return httpx.Response(200, content=self.data, headers={"Content-Length": str(len(self.data))})

    def device(self, cache_dir, **settings: object) -> OnnxDeviceRuntime:
        """An ONNX device of this server (one thread), caching in ``cache_dir``."""
        config = DeviceSettings(server="http://qpart.test", cache_dir=cache_dir, retries=1, backoff_s=0.01,
                                **settings)
        client = httpx.Client(base_url=config.server, transport=httpx.MockTransport(self))
        return OnnxDeviceRuntime(config, transport=Transport(config, client=client), threads=1)


def conv_chain(nodes: int = 48, channels: int = 16, size: int = 32) -> bytes:
    """A legitimate but slow head for :data:`METADATA`: ``nodes`` 3 x 3 convolutions (padded) over
    [N, channels, size, size], each 2 x channels**2 x 9 x size**2 operations per sample, then a
    global average to the activation [N, channels] (read as the logits of an all-device plan)."""
    convs = [helper.make_node("Conv", [f"t{i}" if i else INPUT_NAME, "w"], [f"t{i + 1}"], pads=[1, 1, 1, 1])
             for i in range(nodes)]
    convs += [helper.make_node("GlobalAveragePool", [f"t{nodes}"], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], [OUTPUT_NAME])]
    weight = numpy_helper.from_array(np.full((channels, channels, 3, 3), 1 / (9 * channels), np.float32), "w")
    shape = ["N", channels, size, size]
    graph = helper.make_graph(
        convs, "head", [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, None)], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)], ir_version=8,
                              producer_name=ONNX_SEGMENT_FORMAT, producer_version=ONNX_SEGMENT_FORMAT_VERSION)
    helper.set_model_props(model, METADATA)
    return model.SerializeToString()
