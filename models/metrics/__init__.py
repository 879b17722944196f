"""The metric seam: what "keeps its level" means for a pattern, one object per metric.

A metric compares the quantized (or split) model with its float parent on the same samples. Each
sample has an *anchor*, the answer it is judged against: its label for a labelled metric, the
float model's own answer for a label-free one (:meth:`Metric.anchor`). A model *hits* a sample
when its answer matches the anchor under the metric (:meth:`Metric.hits`). Against the float
model's hits on the same samples, a pattern *loses* the samples the float model hit and it does
not, and *gains* the ones it hits and the float model did not; the metric's per-sample loss is
``lost − gained`` (in ``{−1, 0, 1}``), and a level is a bound on its mean. A label-free metric's
float model hits every sample (its anchor is its own answer), so nothing is gained and the bound
is a one-sample one on the share lost (:attr:`Metric.paired` false), tighter than the paired one.

Learn then Test, the report, the artifact's ``promise.metric``, the server's metadata and the
plan's level all name the metric by :attr:`Metric.name`.

**Adding a metric** is one module beside this one that defines a class with the four attributes
and two methods of :class:`Metric`, one line registering it in :data:`METRICS` below, and its
tests (``tests/models/metrics/``). Nothing else changes: every consumer asks this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qpart.models.errors import UnknownMetricError
from qpart.models.metrics.base import Metric
from qpart.models.metrics.top1 import Top1Agreement, Top1Drop
from qpart.models.metrics.top5 import Top5Drop

if TYPE_CHECKING:  # annotations only: the torch-free device imports the settings that name metrics
    import torch

METRICS: dict[str, Metric] = {m.name: m for m in (Top1Drop(), Top1Agreement(), Top5Drop())}
"""Every metric by name (adding one: its module, and its instance on this line)."""
DEFAULT_METRIC = "top1-drop"


def get_metric(name: str) -> Metric:
    """The metric called ``name``.

    Raises:
        UnknownMetricError: no such metric (the message lists the known ones).
    """
    try:
        return METRICS[name]
    except KeyError:
        raise UnknownMetricError(f"unknown metric {name!r}; known: {', '.join(METRICS)}") from None


def hits_of(metric: Metric, logits: torch.Tensor, labels: np.ndarray | None) -> np.ndarray:
    """``metric``'s hits of ``logits`` judged on their own anchor (a labelled metric's accuracy
    per sample, e.g. for a training report)."""
    return metric.hits(logits, metric.anchor(logits, labels))


__all__ = ["DEFAULT_METRIC", "METRICS", "Metric", "Top1Agreement", "Top1Drop", "Top5Drop",
           "UnknownMetricError", "get_metric", "hits_of"]
