"""Heads of models beyond the conformance set on the ONNX Runtime device (issue 48): an integer
buffer used for indexing (a relative-position index, as in Swin) travels with its integer type,
passes the device's check and runs; the result equals the torch head's."""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch import nn

from qpart.client.onnx_runtime import check_segment, create_session
from qpart.client.plans import PlanResponse
from qpart.kernels.onnx_segment import INPUT_NAME, OUTPUT_NAME, HeadRuntime
from qpart.models.partition import cuts_of, prepare, split
from qpart.models.runtimes import runtime_refusals
from qpart.profiles.artifacts import Pattern
from qpart.server.store.segments import build_onnx_segment
from tests.client.samples import PLAN

INPUT_SHAPE = (3, 4, 4)


class RelativePositionAttention(nn.Module):
    """Self-attention over 16 positions with a learned bias looked up by an int64 index buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.table = nn.Parameter(torch.randn(31, 1))
        position = torch.arange(16)
        self.register_buffer("index", (position[:, None] - position[None, :] + 15).reshape(-1))
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).flatten(2).transpose(1, 2)  # N, 16, 8
        bias = self.table[self.index].view(16, 16)
        x = torch.softmax(x @ x.transpose(1, 2) + bias, -1) @ x
        return self.fc(x.mean(1))


def _onnx_plan(cut: int, cut_node: str, cuts: int, data: bytes) -> PlanResponse:
    digest = hashlib.sha256(data).hexdigest()
    segment = {"id": digest, "url": f"/v1/segments/{digest}", "size_bytes": len(data), "sha256": digest,
               "held": False, "runtime": "onnx"}
    return PlanResponse.model_validate({**PLAN, "plan_id": f"relpos@1/c{cut}", "model": "relpos",
                                        "version": "1", "cut": cut, "cut_node": cut_node, "cuts": cuts,
                                        "segment": segment})


def test_an_int64_index_buffer_keeps_its_type_and_the_head_runs_on_the_onnx_device():
    torch.manual_seed(0)
    gm = prepare(RelativePositionAttention().eval(), INPUT_SHAPE)
    cuts = cuts_of(gm)
    cut = cuts[-1]
    head, _ = split(gm, cut)
    assert runtime_refusals(head, INPUT_SHAPE).get(HeadRuntime.ONNX.value) is None
    pattern = Pattern.model_construct(pattern_id=f"c{cut.index}", cut=cut.index, weight_bits={})
    data = build_onnx_segment(head, INPUT_SHAPE, "relpos", "1", pattern)
    check_segment(_onnx_plan(cut.index, cut.node, len(cuts), data), data)
    x = torch.randn((3, *INPUT_SHAPE), generator=torch.Generator().manual_seed(1))
    got = create_session(data, threads=1).run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0]
    with torch.no_grad():
        want = head(x).numpy()
    assert got.shape == want.shape == (3, 5)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5)
