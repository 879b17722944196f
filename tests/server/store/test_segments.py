"""Segment store: never above its budget, least important first out, counters that agree."""

from __future__ import annotations

import hashlib
import re

import pytest

from qpart.server.store.segments import SegmentStore
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


def test_more_segments_than_the_budget_holds_over_http(every_cut):
    # A budget of ~2 mid-size segments; walk every pattern's segment (at every cut) twice, in two orders.
    budget = 120_000
    with make_client(every_cut, segment_cache_bytes=budget) as client:
        info = client.get("/v1/models/fmnist-cnn").json()
        segments = [p["segment"] for p in info["patterns"] if p["segment"]]
        assert sum(s["size_bytes"] for s in segments) > budget
        base = client.get("/metrics").text
        observed = {"hit": 0, "miss": 0}
        resident_max = 0.0
        for seg in segments + segments[::-1] + segments[:3] * 3:
            response = client.get(seg["url"])
            assert hashlib.sha256(response.content).hexdigest() == seg["id"]  # never partial or stale
            observed[response.headers["x-cache"]] += 1
            resident_max = max(resident_max, _metric(client.get("/metrics").text,
                                                     "qpart_segment_cache_resident_bytes"))
        final = client.get("/metrics").text
        assert resident_max <= budget
        assert observed["hit"] > 0 and observed["miss"] > 0
        for name in ("hit", "miss"):
            key = f"qpart_segment_cache_{name}{'s' if name == 'hit' else 'es'}_total"
            assert _metric(final, key) - _metric(base, key) == observed[name]
        assert _metric(final, "qpart_segment_cache_evictions_total") > 0
