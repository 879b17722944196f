"""The metric protocol (the seam's contract; :mod:`qpart.models.metrics` explains it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from qpart.models.errors import LabelsError

if TYPE_CHECKING:  # annotations only: the torch-free device imports the settings that name metrics
    import torch


class Metric(Protocol):
    """One per-sample comparison of a model with its float parent (module doc)."""

    name: str
    """Its name in settings, artifacts and the API, e.g. ``top1-drop``."""
    short: str
    """What a level bounds, in two or three words ("top-1 drop"), for tables and headings."""
    summary: str
    """What a level of it bounds, as the promise says it ("its {summary} ... is at most its level")."""
    needs_labels: bool
    """Its anchor is the label: a source without labels cannot be judged by it."""
    paired: bool
    """Gains can offset losses (a paired bound); false: only losses count (a one-sample bound)."""

    def anchor(self, float_logits: torch.Tensor, labels: np.ndarray | None) -> np.ndarray:
        """Per sample, what answers are judged against (labels, or the float model's answer)."""
        ...

    def hits(self, logits: torch.Tensor, anchor: np.ndarray) -> np.ndarray:
        """Per sample, whether ``logits`` match the sample's ``anchor`` (a boolean vector)."""
        ...


def require_labels(labels: np.ndarray | None, name: str) -> np.ndarray:
    """``labels``, or a one-line :class:`LabelsError` naming the metric that needs them."""
    if labels is None:
        raise LabelsError(f"the {name} metric needs labels; use top1-agreement for data without them")
    return labels
