"""Size arithmetic worked out on the server (models.onnx_fold, ADR 0019): values made from the
input's shape are evaluated only while they are small; an activation-sized one
(``torch.zeros_like(x)``) is never materialized at the fold's batch sizes."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
import torch
from torch import nn

from qpart.models.errors import PartitionError
from qpart.models.onnx_export import export_head, head_to_onnx
from qpart.models.onnx_fold import BATCHES
from qpart.models.partition import cuts_of, prepare, split

INPUT_SHAPE = (3, 64, 64)


class ZerosLike(nn.Module):
    """A convolution to 16 x 64 x 64, plus a zeros tensor of that shape made from the activation's."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return x + torch.zeros_like(x)


class PositionIndex(nn.Module):
    """A relative-position index computed in ``forward`` from ``arange`` (a small value to fold)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.table = nn.Parameter(torch.randn(127))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).flatten(2)[:, :, :64]  # N, 4, 64
        position = torch.arange(x.shape[-1])  # the exporter writes Shape, Gather, Range
        index = (position[:, None] - position[None, :] + 63).reshape(-1)
        return x @ self.table[index].view(64, 64)


def _head(module: nn.Module) -> torch.fx.GraphModule:
    gm = prepare(module.eval(), INPUT_SHAPE)
    return split(gm, cuts_of(gm)[-1])[0]


def _floats(head: torch.fx.GraphModule) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in [*head.named_parameters(), *head.named_buffers()]}


def test_a_zeros_like_of_a_large_activation_is_refused_without_materializing_it():
    head = _head(ZerosLike())
    export_head(head, INPUT_SHAPE)  # the exporter's own time and memory are not the fold's
    per_batch = BATCHES[0] * 16 * 64 * 64 * 4  # bytes of the zeros at the fold's first batch: 264 MB
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(PartitionError, match="reads a value that depends on the batch"):
            head_to_onnx(head, INPUT_SHAPE, {}, _floats(head), {})
        elapsed_s = time.perf_counter() - started
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak_bytes < per_batch / 16, peak_bytes
    assert elapsed_s < 5.0


def test_a_small_index_made_from_arange_is_still_folded_into_a_constant():
    head = _head(PositionIndex())
    model = head_to_onnx(head, INPUT_SHAPE, {}, _floats(head), {})
    assert "Range" in {n.op_type for n in export_head(head, INPUT_SHAPE).graph.node}
    ops = {n.op_type for n in model.graph.node}
    assert not ops & {"Range", "ConstantOfShape", "Shape"}, ops
