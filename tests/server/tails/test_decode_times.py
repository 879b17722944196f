"""What decoding served packets took prices the packet plans (server.tails.decode_times)."""

from __future__ import annotations

import pytest

from qpart.client.plans import PlanResponse
from qpart.client.runtime import encode_for_plan
from qpart.kernels.coding import zstd_compress
from qpart.models.data import Split, load_split
from qpart.server.tails.decode_times import LEAST, MAX_SAMPLE_S, STALE_AFTER_S, WINDOW, DecodeTimes
from tests.server.conftest import make_client, slow_decoding


def test_a_cut_and_coding_is_priced_by_its_own_samples_once_it_has_enough():
    times = DecodeTimes()
    assert times.seconds("m", "1", 4) == [0.0] * 4  # nothing served yet
    for s in (0.001, 0.002, 0.003):
        times.observe("m", "1", 0, "zstd", s, 1)
    assert times.seconds("m", "1", 4, "zstd") == [0.002, 0.002, 0.002, 0.0]  # others: the pooled median
    for s in (0.004, 0.005, 0.006):
        times.observe("m", "1", 2, "identity", s, 1)
    times.observe("m", "1", 2, "identity", 0.05, 10)  # a batch decodes at another cost: not counted
    assert times.seconds("m", "1", 4, "zstd") == [0.002, pytest.approx(0.0035), pytest.approx(0.0035), 0.0]
    assert times.seconds("m", "1", 4) == [pytest.approx(0.0035), pytest.approx(0.0035), pytest.approx(0.005),
                                          0.0]  # the last cut uploads nothing
    assert times.seconds("m", "2", 4) == [0.0] * 4  # another version learns on its own
    prices = times.prices("m", "1", 4, ["zstd", "deflate"])
    assert list(prices) == ["identity", "zstd", "deflate"] and prices["zstd"][0] == 0.002


def test_the_price_follows_the_last_window_and_one_stall_moves_it_little():
    times = DecodeTimes()
    for _ in range(WINDOW):
        times.observe("m", "1", 0, "identity", 0.5e-3, 1)
    times.observe("m", "1", 0, "identity", 5.0, 1)  # one stall
    assert times.seconds("m", "1", 2)[0] == 0.5e-3
    for _ in range(WINDOW // 2 + 1):
        times.observe("m", "1", 0, "identity", 0.2e-3, 1)
    assert times.seconds("m", "1", 2)[0] == 0.2e-3  # the newer half rules


def test_a_price_set_too_high_lapses_to_the_pooled_one_and_restarts_its_window():
    now = [0.0]
    times = DecodeTimes(clock=lambda: now[0])
    for _ in range(LEAST):  # stalls set cut 0's raw price high: the planner would avoid it
        times.observe("m", "1", 0, "identity", 1.0, 1)
    assert times.seconds("m", "1", 3)[0] == MAX_SAMPLE_S  # each counted at most MAX_SAMPLE_S
    for _ in range(WINDOW):  # other cuts keep serving
        now[0] += 10.0
        times.observe("m", "1", 1, "identity", 2e-4, 1)
    assert times.seconds("m", "1", 3)[0] == MAX_SAMPLE_S  # still its own (newest 90 s old)
    now[0] = STALE_AFTER_S + 1.0
    assert times.seconds("m", "1", 3)[0] == 2e-4  # lapsed: the pooled price
    times.observe("m", "1", 0, "identity", 3e-4, 1)  # its next sample starts afresh
    assert times.seconds("m", "1", 3)[0] == 2e-4  # (one sample: still pooled)
    for _ in range(LEAST - 1):
        times.observe("m", "1", 0, "identity", 3e-4, 1)
    assert times.seconds("m", "1", 3)[0] == 3e-4


def test_the_pooled_price_forgets_samples_older_than_the_lapse():
    """Stalls on a young server set the pooled price too; if the planner then sends no packet at
    all, no newer sample would push them out, so they expire as a (cut, coding)'s own do."""
    now = [0.0]
    times = DecodeTimes(clock=lambda: now[0])
    for _ in range(LEAST):
        times.observe("m", "1", 0, "identity", 1.0, 1)
    assert times.seconds("m", "1", 3, "zstd") == [MAX_SAMPLE_S, MAX_SAMPLE_S, 0.0]  # pooled
    now[0] = STALE_AFTER_S
    assert times.seconds("m", "1", 3, "zstd")[1] == MAX_SAMPLE_S  # not yet
    now[0] = STALE_AFTER_S + 1.0
    assert times.seconds("m", "1", 3) == [0.0] * 3 and times.seconds("m", "1", 3, "zstd") == [0.0] * 3


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "router"])
def test_served_packets_decoding_prices_the_plans(cnn_only, monkeypatch, fast_path):
    """A server whose packets take 2 ms longer to dequantize and 3 ms longer to undo zstd
    publishes those figures per coding and cut, and prices a plan's server time as its tail plus its coding's
    decoding (before any packet, decoding is priced at 0)."""
    slow_decoding(monkeypatch, 0.003, 0.002)
    body = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6, "device": "raspberry-pi-4"}
    with make_client(cnn_only, inference_fast_path=fast_path) as c:
        info = c.get("/v1/models/fmnist-cnn").json()
        assert set(info["server_decode_s"]) == {"identity", "deflate", "zstd"}
        assert all(s == 0.0 for per_cut in info["server_decode_s"].values() for s in per_cut)
        plan = c.post("/v1/plan", json=body).json()
        assert plan["cut"] < info["cuts"] - 1 and plan["upload_encoding"] == "identity"
        assert plan["predicted"]["time_s"]["server"] == pytest.approx(info["server_tail_s"][plan["cut"]])
        assert plan["all_server"]["time_s"]["server"] == pytest.approx(info["server_tail_s"][0])
        packet = encode_for_plan(load_split(Split.TEST, limit=1).images, PlanResponse.model_validate(plan))
        for _ in range(LEAST):
            assert c.post(plan["infer_url"], content=packet).status_code == 200
        info = c.get("/v1/models/fmnist-cnn").json()
        raw = info["server_decode_s"]["identity"][plan["cut"]]
        assert raw >= 0.002
        assert info["server_decode_s"]["zstd"][plan["cut"]] == raw  # no zstd packet yet: the pooled median
        for _ in range(LEAST):
            r = c.post(plan["infer_url"], content=zstd_compress(packet), headers={"Content-Encoding": "zstd"})
            assert r.status_code == 200
        info = c.get("/v1/models/fmnist-cnn").json()
        zstd = info["server_decode_s"]["zstd"][plan["cut"]]
        assert zstd >= 0.005
        assert info["server_decode_s"]["identity"][plan["cut"]] == raw
        again = c.post("/v1/plan", json=body).json()  # the request offers no coding: identity
        tail = info["server_tail_s"][0]
        decode = info["server_decode_s"]["identity"][0]  # the pooled median, were the plan's cut not 0
        assert again["all_server"]["time_s"]["server"] == pytest.approx(tail + decode)
        assert decode >= 0.002
