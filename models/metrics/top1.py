"""Top-1 metrics: the drop in accuracy against labels, and agreement with the float model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qpart.models.metrics.base import require_labels

if TYPE_CHECKING:  # annotations only: the torch-free device imports the settings that name metrics
    import torch


def top1(logits: torch.Tensor) -> np.ndarray:
    """Each sample's highest-scoring class."""
    return np.asarray(logits.argmax(1).numpy())


class Top1Drop:
    """Top-1 accuracy against labels; a level bounds the net drop from the float model's."""

    name = "top1-drop"
    short = "top-1 drop"
    summary = "expected top-1 drop"
    needs_labels = True
    paired = True

    def anchor(self, float_logits: torch.Tensor, labels: np.ndarray | None) -> np.ndarray:
        return require_labels(labels, self.name)

    def hits(self, logits: torch.Tensor, anchor: np.ndarray) -> np.ndarray:
        return np.asarray(top1(logits) == anchor)


class Top1Agreement:
    """Agreement with the float model's top-1, no labels needed; a level bounds the share of
    samples whose top-1 differs, which also bounds the top-1 accuracy drop on any labels."""

    name = "top1-agreement"
    short = "top-1 disagreement"
    summary = ("expected share of inputs whose top-1 differs from the float model's (which bounds "
               "their top-1 drop on any labels too)")
    needs_labels = False
    paired = False

    def anchor(self, float_logits: torch.Tensor, labels: np.ndarray | None) -> np.ndarray:
        return top1(float_logits)

    def hits(self, logits: torch.Tensor, anchor: np.ndarray) -> np.ndarray:
        return np.asarray(top1(logits) == anchor)
