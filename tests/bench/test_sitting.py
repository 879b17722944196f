"""bench.e2e.sitting: each cell's runs are its own plans', each segment is fetched once a sitting, and
a preset's warm cell holds what its own cold cell needed (review of 675757f)."""

from __future__ import annotations

import types

import bench.e2e.sitting as S


class _Answer:
    content = b"x"

    def raise_for_status(self) -> None:
        pass

    def json(self) -> dict:
        return {"server_tail_s": [0.0] * 4, "server_decode_s": {"identity": [0.0] * 4}}


class _Client:
    def __init__(self) -> None:
        self.got: list[str] = []

    def get(self, url: str) -> _Answer:
        self.got.append(url)
        return _Answer()


def _plan(pid, cut, seg=None, enc="identity"):
    return {"pattern_id": pid, "cut": cut, "segment": seg, "upload_encoding": enc,
            "predicted": {"objective": 0.0}}


def _seg(i):
    return {"id": f"seg{i}", "url": f"/s/{i}"}


# cold a takes P1 (seg1), cold b P2 (seg2, zstd); warm a's planner takes P2 (held by b's cold cell
# only), warm b a fixed strategy's P3 (seg3, fetched only now)
TABLE = {("a", "cold"): {"qpart": _plan("P1", 1, _seg(1)), "fixed": _plan("P0", 0)},
         ("b", "cold"): {"qpart": _plan("P2", 2, _seg(2), "zstd"), "fixed": _plan("P0", 0)},
         ("a", "warm"): {"qpart": _plan("P2", 2, _seg(2)), "fixed": _plan("input-png", 0)},
         ("b", "warm"): {"qpart": _plan("P2", 2, _seg(2), "zstd"), "fixed": _plan("P3", 3, _seg(3))}}


def test_a_sittings_cells_hold_download_and_run_what_each_planned(monkeypatch):
    held_seen, results = {}, {}

    def plan_cell(client, url, model, device, preset, cache, link, held, image):
        held_seen[preset, cache] = sorted(held)
        plans = {k: dict(v) for k, v in TABLE[preset, cache].items()}
        return S.CellPlans(preset, cache, frozenset(held), None, plans["qpart"], 0.0, plans)

    def rounds(once, order, n, clock, ref, rng, reps):
        return {k: [{"key": k}] for k in order}, [1.0]

    def fake_results(model, device, preset, inputs, ratio, qplan, plans, baselines, download_s, keyed):
        results[len(results)] = (preset, dict(download_s), {s: r[0]["key"] for s, r in keyed.items()})
        return {s: {"measured_J": 1.0, "meets_demand": True} for s in keyed}

    monkeypatch.setattr(S, "plan_cell", plan_cell)
    monkeypatch.setattr(S, "_head", lambda model, p, segment: p["pattern_id"])
    monkeypatch.setattr(S, "profile", lambda *a: None)
    monkeypatch.setattr(S, "image_offer", lambda *a: {"png_bytes": 1})
    monkeypatch.setattr(S, "implied_rtt", lambda *a: 0.001)
    monkeypatch.setattr(S, "run_rounds", rounds)
    monkeypatch.setattr(S, "_results", fake_results)
    monkeypatch.setattr(S, "_predict", lambda *a: {"objective": 0.0})
    monkeypatch.setattr(S, "measured_j", lambda *a: {"measured_J": 1.0})
    cuts = [types.SimpleNamespace(head_flops=1.0)] * 4
    model = types.SimpleNamespace(
        name="m", cuts=4, segments={}, heads={}, reference_s=1.0,
        artifact=types.SimpleNamespace(cuts=cuts, image_ladder=None),
        patterns=[{"pattern_id": "L1", "level": 0, "cut": 1, "segment": {"id": "segL1", "url": "/s/L1"}}],
        plan_of=dict)
    link = types.SimpleNamespace(wire=types.SimpleNamespace(quiet=lambda: None), rate_mbps=5.0)
    baselines = [types.SimpleNamespace(name="autoencoder@1", kind="ae", cut=1),
                 types.SimpleNamespace(name="input-png", kind="codec", cut=0)]
    client = _Client()
    records, _, got = S.run_sitting(client, "", model, types.SimpleNamespace(name="d"), 1.0, ("a", "b"),
                                    link, [0], [0], baselines, (1, 1, 0.0), None, 0)
    fetched = [u for u in client.got if u != "/v1/models/m"]  # the tail prices, then the downloads
    assert len(fetched) == len(set(fetched)) == 5  # seg1, segL1, encoder, seg2, seg3: once each
    assert got == {"seg1", "seg2", "seg3", "segL1", "ae-encoder-m-1"}
    # a preset's warm cell holds what its own cold cell needed, not another preset's downloads
    assert held_seen["a", "warm"] == ["ae-encoder-m-1", "seg1", "segL1"]
    assert held_seen["b", "warm"] == ["ae-encoder-m-1", "seg2", "segL1"]
    by_cell = {(r["preset"], r["cache"]): r for r in records}
    assert list(by_cell) == [("a", "cold"), ("a", "warm"), ("b", "cold"), ("b", "warm")]
    charged = {(TABLE_KEYS[i]): v for i, v in results.items()}
    (_, warm_a_dl, warm_a_runs) = charged["a", "warm"]
    assert warm_a_dl["qpart"] > 0 and warm_a_dl["autoencoder@1"] == 0  # seg2 not held by a
    assert warm_a_runs["qpart"] == "P2/identity" and warm_a_runs["fixed"] == "input-png"
    assert charged["b", "warm"][2]["qpart"] == "P2/zstd"  # the same pattern in another coding: apart
    assert charged["b", "warm"][1]["qpart"] == 0 and charged["b", "warm"][1]["fixed"] > 0
    assert all("twin_J" in r for r in records)


TABLE_KEYS = [("a", "cold"), ("b", "cold"), ("a", "warm"), ("b", "warm")]  # the order cells are planned
