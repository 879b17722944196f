"""bench.harness.exchange: from probes of a link to the rtt and upload rate a plan request carries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.harness.exchange import (
    MAX_RATE_FACTOR,
    MAX_UPLOAD_RATE_BPS,
    ExchangeProbe,
    fit_exchange,
    overhead,
    probe_medians,
)


def test_medians_pair_the_exchanges():
    p = probe_medians([2.0, 3.0, 4.0], [2.5, 3.1, 4.6], small_body_s=0.5, large_body_s=1.5)
    assert p.small_rest_s == 3.0 and p.extra_wire_s == 1.0 and p.small_body_s == 0.5
    assert p.hidden_s == pytest.approx(0.5)  # median of 0.5, 0.9, 0.4
    with pytest.raises(ValueError):
        probe_medians([1.0], [1.0, 2.0], 0.5, 1.5)
    with pytest.raises(ValueError):
        fit_exchange([], 1e6, lambda r: 0.0)
    with pytest.raises(ValueError, match="differ"):  # two bodies of one size say nothing of a rate
        fit_exchange([ExchangeProbe(0.002, 0.0, 0.0, 0.0001)], 1e6, lambda r: 0.0)


@given(base=st.floats(0.0005, 0.005), small_bytes=st.integers(50, 1000), extra_bytes=st.integers(100, 5000),
       goodput=st.floats(1e5, 1e8), speedup=st.floats(0.5, 3.0))
def test_the_fit_reproduces_both_exchanges_of_a_link_whose_bodies_pass_at_their_own_rate(
        base, small_bytes, extra_bytes, goodput, speedup):
    """A link that moves an upload body at ``speedup`` x the goodput: the fit finds that rate and
    reproduces both probed exchanges."""
    other = 0.0003  # headers and answer, at the goodput
    body_rate = goodput * speedup
    small = base + other + small_bytes * 8 / body_rate
    large = base + other + (small_bytes + extra_bytes) * 8 / body_rate
    probe = probe_medians([small], [large], small_bytes * 8 / goodput,
                          (small_bytes + extra_bytes) * 8 / goodput)

    def transfer(rate, body=small_bytes):
        return other + body * 8 / rate

    rtt, rate = fit_exchange([probe], goodput, transfer)
    assert rate == pytest.approx(body_rate, rel=1e-6)
    assert rtt == pytest.approx(base, abs=1e-9)
    assert rtt + transfer(rate) == pytest.approx(small, abs=1e-9)  # the small exchange, reproduced
    assert rtt + transfer(rate, small_bytes + extra_bytes) == pytest.approx(large, abs=1e-9)  # the large one


def test_bodies_that_took_no_time_are_priced_nearly_free_and_the_rtt_is_never_negative():
    # the large exchange's extra bytes took nothing (noise at 100 Mbit/s): the fastest rate
    flat = ExchangeProbe(small_rest_s=0.0016, hidden_s=0.0003, extra_wire_s=0.0002, small_body_s=0.00003)
    rtt, rate = fit_exchange([flat], 1e8, lambda r: 0.0001)
    assert rate == pytest.approx(1e8 * MAX_RATE_FACTOR) and rtt == pytest.approx(0.0015)
    # never above what a plan request accepts, however fast the link
    assert fit_exchange([flat], 1e10, lambda r: 0.0001)[1] == MAX_UPLOAD_RATE_BPS
    # priced above what was measured: no negative overhead
    assert fit_exchange([flat], 1e8, lambda r: 0.004)[0] == 0.0
    # slower than the goodput (every packet's acknowledgement on a slow link): a slower rate
    slow = ExchangeProbe(small_rest_s=0.015, hidden_s=-0.0025, extra_wire_s=0.025, small_body_s=0.0028)
    assert fit_exchange([slow], 1e6, lambda r: 0.003)[1] == pytest.approx(1e6 / 1.1)


def test_the_window_takes_medians_so_one_odd_probe_does_not_move_the_plan():
    usual = ExchangeProbe(0.0021, 0.0001, 0.0003, 0.00003)
    odd = ExchangeProbe(0.0040, -0.001, 0.0003, 0.00003)
    rtt, rate = fit_exchange([usual, odd, usual], 1e7, lambda r: 0.0001)
    assert rtt == pytest.approx(0.0020) and rate == pytest.approx(1e7 * 0.0003 / 0.0002)


def test_the_overhead_follows_the_traffic_once_two_cells_agree():
    assert overhead(0.8e-3, []) == 0.8e-3  # probes alone at first
    assert overhead(0.8e-3, [1.5e-3]) == pytest.approx(1.15e-3)
    assert overhead(0.8e-3, [1.5e-3, 1.6e-3]) == 1.5e-3  # one probe cannot outvote two cells
    assert overhead(0.8e-3, [-1e-3, -2e-3]) == 0.0  # never negative


def test_the_overhead_refuses_what_is_not_a_number():
    with pytest.raises(ValueError, match="finite"):
        overhead(float("nan"), [1e-3])
