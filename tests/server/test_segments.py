"""Segment store: never above its budget, least important first out, counters that agree."""

from __future__ import annotations

import hashlib
import re

import pytest

from server.segments import SegmentStore
from tests.server.conftest import make_client


def _blob(i: int, size: int) -> tuple[str, bytes]:
    data = bytes([i % 251]) * size
    return hashlib.sha256(data).hexdigest(), data


def test_resident_bytes_never_exceed_the_budget():
    store = SegmentStore(budget_bytes=10_000)
    for i in range(50):
        sid, data = _blob(i, 1000 + 37 * i)
        store.get_or_build(sid, lambda d=data: d)
        assert store.stats().resident_bytes <= 10_000
    assert store.stats().evictions > 0


def test_frequently_used_small_segments_survive_a_big_one():
    clock = [0.0]
    store = SegmentStore(budget_bytes=3000, clock=lambda: clock[0])
    hot_id, hot = _blob(1, 1000)
    for _ in range(5):
        store.get_or_build(hot_id, lambda: hot)
        clock[0] += 1
    cold_id, cold = _blob(2, 1000)
    store.get_or_build(cold_id, lambda: cold)
    big_id, big = _blob(3, 1500)
    store.get_or_build(big_id, lambda: big)
    hits = store.stats().hits
    store.get_or_build(hot_id, lambda: pytest.fail("the hot segment was evicted"))
    assert store.stats().hits == hits + 1


def test_a_rebuild_that_does_not_match_its_id_is_refused():
    store = SegmentStore(budget_bytes=1000)
    sid, _ = _blob(1, 10)
    with pytest.raises(RuntimeError, match="does not match"):
        store.get_or_build(sid, lambda: b"something else")
    assert store.stats().entries == 0


def test_shrinking_the_budget_evicts_at_once():
    store = SegmentStore(budget_bytes=5000)
    for i in range(4):
        sid, data = _blob(i, 1000)
        store.put(sid, data)
    store.set_budget(1500)
    assert store.stats().resident_bytes <= 1500


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_more_segments_than_the_budget_holds_over_http(cnn_only):
    # A budget of ~2 mid-size segments; walk every pattern's segment twice.
    with make_client(cnn_only, segment_cache_bytes=120_000) as client:
        info = client.get("/v1/models/fmnist-cnn").json()
        segments = [p["segment"] for p in info["patterns"] if p["segment"]]
        assert sum(s["size_bytes"] for s in segments) > 120_000
        base = client.get("/metrics").text
        hits0, misses0 = (_metric(base, "qpart_segment_cache_hits_total"),
                          _metric(base, "qpart_segment_cache_misses_total"))
        observed_hits = observed_misses = 0
        resident_max = 0.0
        for _ in range(2):
            for seg in segments:
                before = client.get("/metrics").text
                body = client.get(seg["url"]).content
                assert hashlib.sha256(body).hexdigest() == seg["id"]
                after = client.get("/metrics").text
                resident_max = max(resident_max, _metric(after, "qpart_segment_cache_resident_bytes"))
                observed_hits += _metric(after, "qpart_segment_cache_hits_total") - _metric(
                    before, "qpart_segment_cache_hits_total")
                observed_misses += _metric(after, "qpart_segment_cache_misses_total") - _metric(
                    before, "qpart_segment_cache_misses_total")
        final = client.get("/metrics").text
        assert resident_max <= 120_000
        assert observed_hits + observed_misses == 2 * len(segments)
        assert _metric(final, "qpart_segment_cache_hits_total") - hits0 == observed_hits
        assert _metric(final, "qpart_segment_cache_misses_total") - misses0 == observed_misses
        assert observed_misses > 0 and _metric(final, "qpart_segment_cache_evictions_total") > 0
