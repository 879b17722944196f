"""bench.micro.label_free on the committed fmnist-cnn artifact (a top1-drop one): each quantized
pattern's top-1 drop on the labelled test images never exceeds its disagreement with the float
model, the bound the label-free promise rests on (issue 49)."""

from __future__ import annotations

import pytest

from bench import REPO
from bench.micro.label_free import check


@pytest.mark.slow
def test_the_top1_drop_never_exceeds_the_disagreement():
    doc = check(REPO / "artifacts" / "fmnist-cnn", limit=300)
    assert doc["metric"] == "top1-drop" and doc["test_images"] == 300 and doc["quantized_patterns"] > 10
    assert doc["drop_above_disagreement"] == 0
    assert any(r["disagreement"] > r["top1_drop"] for r in doc["patterns"])  # gains offset some losses
