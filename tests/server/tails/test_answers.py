"""A tail batch's answer: vectorized softmax and order, sliced per request, written as TailResponse."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from qpart.server.schemas import TailResponse
from qpart.server.tails.answers import TailRows, tail_json, tail_rows

finite_logits = arrays(np.float32, st.tuples(st.integers(1, 8), st.integers(1, 12)),
                       elements=st.floats(-80, 80, width=32))


def _plain(values: list[float], k: int) -> list[tuple[int, float]]:
    """Softmax and top-k of one row the obvious way, in Python floats."""
    top = max(values)
    shifted = [math.exp(v - top) for v in values]
    total = sum(shifted)
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))  # exp may round near-ties equal
    return [(i, shifted[i] / total) for i in order[:k]]


@settings(max_examples=200, deadline=None)
@given(logits=finite_logits, top_k=st.integers(-3, 20), start=st.integers(0, 7))
def test_a_requests_slice_answers_what_a_plain_softmax_gives(logits, top_k, start):
    rows = tail_rows(logits)
    assert rows.finite.all() and len(rows) == logits.shape[0]
    start = min(start, logits.shape[0] - 1)
    mine = rows[start:]
    doc = TailResponse.model_validate_json(tail_json(plan_id="m@1/p", model="m", version="1", rows=mine,
                                                     top_k=top_k, queue_s=0.5, compute_s=0.25))
    assert (doc.plan_id, doc.model, doc.version, doc.queue_s, doc.compute_s) == ("m@1/p", "m", "1", 0.5, 0.25)
    assert len(doc.results) == logits.shape[0] - start
    k = max(1, min(top_k, logits.shape[1]))
    for result, row in zip(doc.results, logits[start:], strict=True):
        assert result.logits == row.tolist()  # exactly the model's float32 values
        want = _plain(row.tolist(), k)
        assert [t.label for t in result.top_k] == [label for label, _ in want]
        chances = [p for _, p in want]
        assert [t.probability for t in result.top_k] == pytest.approx(chances, rel=1e-9, abs=1e-15)


def test_rows_with_nan_or_infinity_are_marked_and_the_rest_untouched():
    logits = np.array([[1.0, 2.0], [np.nan, 0.0], [np.inf, 1.0], [0.0, -np.inf]], dtype=np.float32)
    rows = tail_rows(logits)
    assert rows.finite.tolist() == [True, False, False, False]
    assert rows.order[0].tolist() == [1, 0]
    total = 1 + math.exp(-1)
    assert rows.probability[0].tolist() == pytest.approx([1 / total, math.exp(-1) / total])


def test_ties_keep_the_lower_class_first():
    rows = tail_rows(np.zeros((1, 5), dtype=np.float32))
    assert rows.order[0].tolist() == [0, 1, 2, 3, 4]
    doc = json.loads(tail_json(plan_id="p", model="m", version="1", rows=rows, top_k=3, queue_s=0,
                               compute_s=0))
    assert doc["results"][0]["top_k"] == [{"label": i, "probability": 0.2} for i in range(3)]


def test_slicing_takes_the_same_rows_of_every_field():
    rows = tail_rows(np.arange(12, dtype=np.float32).reshape(4, 3)[:, ::-1].copy())
    part = rows[1:3]
    assert isinstance(part, TailRows) and len(part) == 2
    assert part.logits.tolist() == [[5, 4, 3], [8, 7, 6]]
    assert part.order.tolist() == [[0, 1, 2], [0, 1, 2]] and part.finite.tolist() == [True, True]


def test_with_the_cards_labels_each_top_class_carries_its_name_beside_its_index():
    rows = tail_rows(np.array([[0.0, 3.0, 1.0]], dtype=np.float32))
    text = tail_json(plan_id="p", model="m", version="1", rows=rows, top_k=2, queue_s=0, compute_s=0,
                     names=("cat", "dog", "emu"))
    top = TailResponse.model_validate_json(text).results[0].top_k
    assert [(t.label, t.name) for t in top] == [(1, "dog"), (2, "emu")]
    assert list(json.loads(text)["results"][0]["top_k"][0]) == ["label", "probability", "name"]
