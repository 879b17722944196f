"""Top-5 accuracy against labels; a level bounds the net drop from the float model's."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qpart.models.metrics.base import require_labels

if TYPE_CHECKING:  # annotations only: the torch-free device imports the settings that name metrics
    import torch

K = 5


class Top5Drop:
    """A sample is a hit when its label is among the ``K`` highest-scoring classes (all of them
    when the model has fewer)."""

    name = "top5-drop"
    short = "top-5 drop"
    summary = "expected top-5 drop"
    needs_labels = True
    paired = True

    def anchor(self, float_logits: torch.Tensor, labels: np.ndarray | None) -> np.ndarray:
        return require_labels(labels, self.name)

    def hits(self, logits: torch.Tensor, anchor: np.ndarray) -> np.ndarray:
        best = logits.topk(min(K, logits.shape[1]), dim=1).indices.numpy()
        return np.asarray((best == np.asarray(anchor)[:, None]).any(1))
