"""The per-batch answer path writes what the replaced per-request code wrote."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from bench.micro.answers import legacy_answer_json, run
from qpart.server.tails.answers import tail_json, tail_rows

IDS = {"plan_id": "m@1/p", "model": "m", "version": "1", "queue_s": 0.00123, "compute_s": 4.5e-4}


@example(logits=np.array([[0.0, 4.86e-17]], dtype=np.float32), top_k=2)  # exp ties them; logit 1 wins
@settings(max_examples=300, deadline=None)
@given(logits=arrays(np.float32, st.tuples(st.integers(1, 6), st.integers(1, 12)),
                     elements=st.floats(-60, 60, width=32)),
       top_k=st.integers(-2, 14))
def test_the_answer_matches_the_replaced_per_request_code(logits, top_k):
    old = legacy_answer_json(logits=logits, top_k=top_k, **IDS)
    new = tail_json(rows=tail_rows(logits), top_k=top_k, **IDS)
    a, b = json.loads(old), json.loads(new)
    assert list(a) == list(b)  # same fields in the same order
    for row, ra, rb in zip(logits.astype(np.float64), a.pop("results"), b.pop("results"), strict=True):
        assert ra["logits"] == rb["logits"]
        k = max(1, min(top_k, row.size))
        ranked = sorted(range(row.size), key=lambda i: (-row[i], i))[:k]  # larger logit first, ties by index
        assert [t["label"] for t in rb["top_k"]] == ranked
        for old_label, new_label in zip([t["label"] for t in ra["top_k"]], ranked, strict=True):
            # the replaced code ranked by exp(v - max) and so ranked by index where those round equal
            top = float(row.max())
            assert old_label == new_label or math.exp(row[old_label] - top) == math.exp(row[new_label] - top)
        # numpy's exp is not libm's: the last bit may differ
        assert [t["probability"] for t in rb["top_k"]] == pytest.approx(
            [t["probability"] for t in ra["top_k"]], rel=1e-14, abs=1e-300)
    assert a == b


def test_most_answers_are_the_same_bytes():
    rng = np.random.default_rng(3)
    same = sum(legacy_answer_json(logits=x, top_k=5, **IDS) == tail_json(rows=tail_rows(x), top_k=5, **IDS)
               for x in rng.standard_normal((200, 1, 10)).astype(np.float32))
    assert same >= 150, same


def test_the_benchmark_reports_both_paths_for_each_batch():
    doc = run(classes=10, top_k=5, rounds=1, number=5)
    assert [r["batch"] for r in doc["batches"]] == [1, 16]
    assert all(r["legacy_s_per_request"] > 0 and r["current_s_per_request"] > 0 for r in doc["batches"])
