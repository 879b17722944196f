"""The metric seam (issue 49): each built-in metric's anchor and hits on hand-made logits, the
registry, and what the Learn then Test counts become under each."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qpart.models import METRICS, UnknownMetricError, get_metric, hits_of
from qpart.models.errors import LabelsError
from qpart.offline.validation import paired_drop

# 4 samples, 6 classes. The float model's top-1: 0, 1, 2, 3; its top-5 leaves out class 5 on each.
FLOAT = torch.tensor([[9, 8, 7, 6, 5, 0], [8, 9, 7, 6, 5, 0], [7, 8, 9, 6, 5, 0], [6, 7, 8, 9, 5, 0]],
                     dtype=torch.float32)
# The pattern: top-1 4, 1, 0, 3 (it differs on samples 0 and 2); class 5 enters sample 3's top-5.
QUANT = torch.tensor([[5, 8, 7, 6, 9, 0], [8, 9, 7, 6, 5, 0], [9, 8, 7, 6, 5, 0], [6, 7, 8, 9, 0, 5]],
                     dtype=torch.float32)
LABELS = np.array([0, 0, 0, 5])  # the float model is right on sample 0 only (top-1)


def _counts(name: str, labels: np.ndarray | None = LABELS) -> tuple[int, int, int, bool]:
    metric = get_metric(name)
    anchor = metric.anchor(FLOAT, labels)
    d = paired_drop(metric.hits(FLOAT, anchor), metric.hits(QUANT, anchor), metric.paired)
    return d.n, d.lost, d.gained, d.paired


def test_top1_drop_counts_lost_and_gained_hits_against_the_labels():
    assert _counts("top1-drop") == (4, 1, 1, True)  # sample 0 lost (0 -> 4), sample 2 gained (2 -> 0)


def test_top1_agreement_counts_every_change_of_top1_and_needs_no_labels():
    assert _counts("top1-agreement", None) == (4, 2, 0, False)
    assert _counts("top1-agreement") == _counts("top1-agreement", None)  # labels are ignored


def test_top5_drop_counts_the_label_leaving_or_entering_the_top5():
    assert _counts("top5-drop") == (4, 0, 1, True)  # sample 3's label 5 entered the pattern's top-5


def test_the_agreement_share_bounds_the_top1_drop_on_any_labels():
    rng = np.random.default_rng(0)
    for _ in range(200):
        labels = rng.integers(0, 6, size=4)
        n, lost, gained, _ = _counts("top1-drop", labels)
        assert (lost - gained) / n <= _counts("top1-agreement", None)[1] / n


@pytest.mark.parametrize("name", ["top1-drop", "top5-drop"])
def test_a_labelled_metric_refuses_data_without_labels_in_one_line(name):
    with pytest.raises(LabelsError, match=f"the {name} metric needs labels; use top1-agreement"):
        get_metric(name).anchor(FLOAT, None)


def test_the_registry_names_each_metric_once_and_refuses_an_unknown_one():
    assert list(METRICS) == ["top1-drop", "top1-agreement", "top5-drop"]
    assert all(m.name == name for name, m in METRICS.items())
    with pytest.raises(UnknownMetricError, match="unknown metric 'top7'; known: top1-drop, top1-agreement"):
        get_metric("top7")


def test_hits_of_is_accuracy_per_sample():
    assert hits_of(get_metric("top1-drop"), FLOAT, LABELS).tolist() == [True, False, False, False]


def test_a_one_sample_count_is_bounded_at_the_full_confidence():
    from qpart.offline.validation import PairedDrop

    one, paired = PairedDrop(1000, 0, 0, paired=False), PairedDrop(1000, 0, 0)
    assert one.upper_bound(0.95) == pytest.approx(1 - 0.05 ** (1 / 1000))  # Clopper-Pearson, 0 of n
    assert one.upper_bound(0.95) < paired.upper_bound(0.95)  # no Bonferroni split: tighter
    assert one.upper_bound(0.95, "newcombe") == one.upper_bound(0.95)  # exact whatever the method
