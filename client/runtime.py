"""The PyTorch device: :class:`client.device.DeviceClient` with heads built from the shared model
code (ADR 0003): the registry's factory is traced and cut exactly as on the server, then every head
tensor is loaded from the segment by name. A segment whose tensors do not cover the head exactly is
refused.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch
from torch import fx

from qpart.client.device import (
    DEFAULT_RATE_BPS,
    MAX_UPLOAD_BATCH,
    DeviceClient,
    HeadFunction,
    InferenceRun,
)
from qpart.client.errors import SegmentError
from qpart.client.plans import HeadSpec, PlanResponse
from qpart.client.uploads import FLOAT_BITS, encode_for_plan, upload_body
from qpart.kernels import KernelError, unpack_dequantize
from qpart.kernels.segment_format import decode_segment
from qpart.models.partition import cuts_of, prepare, split
from qpart.models.registry import get_model

__all__ = ["DEFAULT_RATE_BPS", "FLOAT_BITS", "MAX_UPLOAD_BATCH", "DeviceRuntime", "InferenceRun",
           "encode_for_plan", "load_head", "upload_body"]


def load_head(plan: HeadSpec, segment: bytes | None) -> fx.GraphModule:
    """Build the plan's head from shared model code and load the segment's tensors into it."""
    spec = get_model(plan.model)
    gm = prepare(spec.build(), spec.input_shape)
    cuts = cuts_of(gm)
    cut = plan.cut
    if len(cuts) != plan.cuts or cut >= len(cuts) or cuts[cut].node != plan.cut_node:
        raise SegmentError(f"this device's code for '{plan.model}' cuts differently from the server "
                           "(update the model package on the device)")
    head, _ = split(gm, cuts[cut])
    expected = dict(head.named_parameters()) | dict(head.named_buffers())
    if segment is None:
        if expected:
            raise SegmentError("the plan has no segment but the head has tensors")
        return head.eval()
    try:
        seg = decode_segment(segment)
    except KernelError as exc:
        raise SegmentError(f"segment does not parse: {exc}") from exc
    if (seg.header.model, seg.header.version, seg.header.cut) != (plan.model, plan.version, cut):
        raise SegmentError(f"segment is for {seg.header.model}@{seg.header.version} cut {seg.header.cut}, "
                           f"the plan for {plan.model}@{plan.version} cut {cut}")
    provided = set(seg.quantized) | set(seg.floats)
    if provided != set(expected):
        raise SegmentError(f"segment tensors {sorted(provided ^ set(expected))} do not match the head")
    with torch.no_grad():
        for name, tensor in expected.items():
            values = unpack_dequantize(seg.quantized[name]) if name in seg.quantized else seg.floats[name]
            if tuple(values.shape) != tuple(tensor.shape):
                raise SegmentError(f"tensor '{name}' is {values.shape} in the segment, "
                                   f"{tuple(tensor.shape)} in the head")
            tensor.copy_(torch.from_numpy(np.require(values, requirements="C")))  # 0-d stays 0-d
    return head.eval()


class DeviceRuntime(DeviceClient):
    """One device talking to one server, running heads with PyTorch."""

    def load_head(self, plan: PlanResponse, segment: bytes | None) -> HeadFunction:
        """The plan's head from shared model code, loaded with the segment's tensors."""
        head = load_head(plan, segment)

        def run(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
            with torch.inference_mode():
                out: npt.NDArray[np.float32] = head(torch.from_numpy(x)).numpy()
            return out

        return run
